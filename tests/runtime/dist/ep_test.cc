// Expert parallelism (ParallelOptions::expert_parallel, `--ep`) against transformers itself: the
// MoE models of tests/fixtures/tp/models (qwen3-moe and mixtral store one tensor per expert,
// gpt-oss its experts stacked; saved by transformers' save_pretrained, every element a value
// found nowhere else) loaded by each rank of 2 and 4, exchanged between threads. Each rank must
// hold exactly the checkpoint tensors, and of each exactly the elements, that transformers'
// from_pretrained(distributed_config=DistributedConfig(tp_size=W, ep_size=W)) loads on that rank
// (tests/fixtures/tp/ep_cases.json, make_ep_fixtures.py), and read nothing of another rank's
// experts.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstone/tensor_parallel.h"
#include "testing/tp_cases.h"
#include "testing/tp_group.h"

namespace loadstone {
namespace {

using testing::kTpModels;
using testing::Layout;
using testing::LoadGroup;
using testing::RankResult;
using testing::Values;

const nlohmann::json& EpCase(const std::string& name) {
  const nlohmann::json& model = testing::EpCase(name);
  REQUIRE(model.is_object());
  return model;
}

// Every tensor of the model, whole (one rank, no plan), by name.
std::map<std::string, std::vector<float>> FullTensors(const std::string& name) {
  const auto whole = LoadGroup(kTpModels + name, Layout{}, "", DType::kF32);
  REQUIRE(whole[0].status.ok());
  std::map<std::string, std::vector<float>> out;
  for (const Tensor& t : whole[0].tensors) out[t.name()] = Values(t);
  return out;
}

// Each rank of `world` loads model folder `folder` under expert parallelism (`ep_plan`: given
// by hand, else config.json's) and must hold what transformers holds in case `name`.
void CheckAgainstTransformers(const std::string& name, int world, ReadMode mode,
                              const std::string& folder = "", const std::string& ep_plan = "") {
  const nlohmann::json& model = EpCase(name);
  const std::string dir = folder.empty() ? name : folder;
  const auto full = FullTensors(dir);
  const auto results = LoadGroup(kTpModels + dir, Layout{world, world, 1, mode, true, ep_plan},
                                 "", DType::kF32);
  uint64_t read = 0;
  for (int r = 0; r < world; ++r) {
    const RankResult& me = results[r];
    const nlohmann::json& held = model["worlds"][std::to_string(world)][r];
    INFO(name << " rank " << r << " of " << world << " (" << ReadModeName(mode)
              << "): " << me.status.ToString());
    REQUIRE(me.status.ok());
    CHECK(me.handled_bytes == me.share.read_bytes);  // the reader read its share, no more
    read += me.share.read_bytes;
    CHECK((me.share.expert_bytes > 0) == (dir != "gpt-oss"));  // stacked experts: plain splits
    REQUIRE(me.tensors.size() == held.size());  // transformers' tensors, no other expert's
    for (const Tensor& t : me.tensors) {
      INFO(t.name());
      REQUIRE(held.contains(t.name()));
      const std::vector<float>& whole = full.at(t.name());
      std::vector<float> expected;
      for (const auto& run : held[t.name()]) {
        for (uint64_t k = 0; k < run[1].get<uint64_t>(); ++k) {
          expected.push_back(whole[run[0].get<uint64_t>() + k]);
        }
      }
      CHECK(Values(t) == expected);
    }
  }
  // The experts split like any split tensor: read once by the group, replicated ones by each
  // rank (read once: by the first rank, the experts by their own ranks).
  const RankShare& first = results[0].share;
  const uint64_t replicated = first.replicated_bytes;
  CHECK(read == first.split_bytes + (mode == ReadMode::kOnce ? 1 : world) * replicated);
}

TEST_CASE("expert parallel: each rank holds transformers' experts (one tensor per expert)") {
  for (const char* name : {"qwen3-moe", "mixtral"}) {
    for (int world : {2, 4}) CheckAgainstTransformers(name, world, ReadMode::kEachRank);
  }
}

TEST_CASE("expert parallel: stacked experts (gpt-oss) split on dim 0 as transformers does") {
  for (int world : {2, 4}) CheckAgainstTransformers("gpt-oss", world, ReadMode::kEachRank);
}

TEST_CASE("expert parallel: read once, each expert's tensors read by its own rank only") {
  for (const char* name : {"qwen3-moe", "gpt-oss"}) {
    CheckAgainstTransformers(name, 2, ReadMode::kOnce);
  }
}

TEST_CASE("expert parallel: the ep plan transformers resolved, given by hand, splits the same") {
  for (const char* name : {"qwen3-moe", "mixtral", "gpt-oss"}) {
    const nlohmann::json& model = EpCase(name);
    CheckAgainstTransformers(name, 2, ReadMode::kEachRank, name, model["ep_plan"].dump());
  }
}

TEST_CASE("expert parallel: a plan that keeps the experts' down_proj whole, as transformers does") {
  // transformers' ep plan with DistributedConfig(ep_plan=...)'s override merged over it: the
  // per-expert down_proj tensors go to every rank, gate_proj / up_proj to their expert's.
  const nlohmann::json& model = EpCase("qwen3-moe-down-replicated");
  nlohmann::json plan = EpCase("qwen3-moe")["ep_plan"];
  for (const auto& [key, style] : model["ep_plan_override"].items()) plan[key] = style;
  CheckAgainstTransformers("qwen3-moe-down-replicated", 2, ReadMode::kEachRank, "qwen3-moe",
                           plan.dump());
}

TEST_CASE("expert × pipeline parallel: 2 stages of 2, each rank its stage's experts") {
  const nlohmann::json& held = EpCase("qwen3-moe")["worlds"]["2"];
  const auto full = FullTensors("qwen3-moe");
  const auto results = LoadGroup(kTpModels + "qwen3-moe",
                                 Layout{4, 2, 2, ReadMode::kEachRank, true}, "", DType::kF32);
  for (int r = 0; r < 4; ++r) {
    const RankResult& me = results[r];
    INFO("rank " << r << ": " << me.status.ToString());
    REQUIRE(me.status.ok());
    const int stage = r / 2;
    // vLLM's split of 2 layers, written out: the embeddings and layer 0, then the rest.
    auto on_stage = [stage](const std::string& n) {
      const bool first = n.starts_with("model.embed_tokens.") || n.starts_with("model.layers.0.");
      return first == (stage == 0);
    };
    std::set<std::string> expected;
    for (const auto& [name, runs] : held[r % 2].items()) {
      if (on_stage(name)) expected.insert(name);
    }
    std::set<std::string> got;
    for (const Tensor& t : me.tensors) {
      got.insert(t.name());
      if (t.name().find(".experts.") != std::string::npos) CHECK(Values(t) == full.at(t.name()));
    }
    CHECK(got == expected);
  }
}

TEST_CASE("expert parallel: read-once's cost leaves one expert's tensors to their own rank") {
  auto ckpt = Checkpoint::Open(kTpModels + std::string("qwen3-moe"));
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 0, .tp = 2,
                                              .expert_parallel = true});
  REQUIRE(share.ok());
  REQUIRE(share->expert_bytes > 0);
  const double split = static_cast<double>(share->split_bytes);
  const double replicated = static_cast<double>(share->replicated_bytes);
  const double sent = split - static_cast<double>(share->expert_bytes);
  const ReadModeCost cost = EstimateReadModes(*share, 1e9, 1e6);
  CHECK(cost.once_seconds ==
        Approx((split + replicated) / 1e9 + (sent / 2 + replicated) / 1e6));
}

TEST_CASE("expert parallel: experts that do not split evenly are refused, as transformers does") {
  for (const char* name : {"qwen3-moe", "mixtral", "gpt-oss"}) {
    const nlohmann::json& refused = EpCase(name)["worlds"]["3"][0];
    REQUIRE(refused.contains("error"));  // transformers: "Cannot evenly shard 4 experts ..."
    CHECK(refused["error"].get<std::string>().find("Cannot evenly shard 4 experts") !=
          std::string::npos);
    auto ckpt = Checkpoint::Open(kTpModels + name);
    REQUIRE(ckpt.ok());
    const ParallelOptions par{.world_size = 3, .rank = 1, .tp = 3, .expert_parallel = true};
    auto share = ShareOf(*ckpt, par);
    REQUIRE_FALSE(share.ok());
    INFO(share.status().ToString());
    CHECK(share.status().code() == StatusCode::kInvalidArgument);
    CHECK(share.status().message().find("experts") != std::string::npos);
    CHECK(share.status().message().find("do not split evenly over 3") != std::string::npos);
  }
}

TEST_CASE("expert parallel: without --ep the experts are replicated, and --ep needs tp > 1") {
  auto ckpt = Checkpoint::Open(kTpModels + std::string("qwen3-moe"));
  REQUIRE(ckpt.ok());
  auto plain = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 1, .tp = 2});
  REQUIRE(plain.ok());
  CHECK(plain->tensors.size() == ckpt->tensors().size());
  CHECK(plain->expert_bytes == 0);
  auto alone = ShareOf(*ckpt, ParallelOptions{.expert_parallel = true});
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.status().message().find("--tp 2 or more") != std::string::npos);
  auto plan_only = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 0, .tp = 2,
                                                  .ep_plan_json = "{}"});
  REQUIRE_FALSE(plan_only.ok());
  CHECK(plan_only.status().message().find("add --ep") != std::string::npos);
  auto empty = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 0, .tp = 2,
                                              .expert_parallel = true, .ep_plan_json = "{}"});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("plan is empty") != std::string::npos);
  auto layers = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 0, .tp = 2,
                                               .pp_layers = {1, 1}});
  REQUIRE_FALSE(layers.ok());
  CHECK(layers.status().message().find("--pp P") != std::string::npos);
}

}  // namespace
}  // namespace loadstone
