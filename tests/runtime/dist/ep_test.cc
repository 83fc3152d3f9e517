// Expert parallelism (ParallelOptions::expert_parallel, `--ep`) against transformers itself: the
// MoE models of tests/fixtures/tp/models (qwen3-moe and mixtral store one tensor per expert,
// gpt-oss its experts stacked; saved by transformers' save_pretrained, every element a value
// found nowhere else) loaded by each rank of 2 and 4, exchanged between threads. Each rank must
// hold exactly the checkpoint tensors, and of each exactly the elements, that transformers'
// from_pretrained(distributed_config=DistributedConfig(tp_size=W, ep_size=W)) loads on that rank
// (tests/fixtures/tp/ep_cases.json, make_ep_fixtures.py), and read nothing of another rank's
// experts.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>
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
  static const nlohmann::json cases = [] {
    std::ifstream in(std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/ep_cases.json");
    std::stringstream text;
    text << in.rdbuf();
    return nlohmann::json::parse(text.str());
  }();
  for (const auto& m : cases["models"]) {
    if (m["name"] == name) return m;
  }
  FAIL("no case " << name << " in ep_cases.json");
  static const nlohmann::json none;
  return none;
}

// Every tensor of the model, whole (one rank, no plan), by name.
std::map<std::string, std::vector<float>> FullTensors(const std::string& name) {
  const auto whole = LoadGroup(kTpModels + name, Layout{}, "", DType::kF32);
  REQUIRE(whole[0].status.ok());
  std::map<std::string, std::vector<float>> out;
  for (const Tensor& t : whole[0].tensors) out[t.name()] = Values(t);
  return out;
}

void CheckAgainstTransformers(const std::string& name, int world, ReadMode mode,
                              const std::string& ep_plan = "") {
  const nlohmann::json& model = EpCase(name);
  const auto full = FullTensors(name);
  Layout layout{world, world, 1, mode, /*ep=*/true};
  std::vector<RankResult> results;
  if (ep_plan.empty()) {
    results = LoadGroup(kTpModels + name, layout, "", DType::kF32);
  } else {  // the plan transformers resolved, given by hand (--ep-plan)
    auto ckpt = Checkpoint::Open(kTpModels + name);
    REQUIRE(ckpt.ok());
    ParallelOptions par{.world_size = world, .rank = 0, .tp = world, .expert_parallel = true,
                        .ep_plan_json = ep_plan};
    auto by_hand = ShareOf(*ckpt, par);
    REQUIRE(by_hand.ok());
    par.ep_plan_json.clear();
    auto from_config = ShareOf(*ckpt, par);
    REQUIRE(from_config.ok());
    REQUIRE(by_hand->tensors.size() == from_config->tensors.size());
    for (size_t i = 0; i < by_hand->tensors.size(); ++i) {
      CHECK(by_hand->tensors[i].name == from_config->tensors[i].name);
      CHECK(by_hand->tensors[i].shape == from_config->tensors[i].shape);
    }
    CHECK(by_hand->read_bytes == from_config->read_bytes);
    return;
  }
  uint64_t read = 0;
  for (int r = 0; r < world; ++r) {
    const RankResult& me = results[r];
    const nlohmann::json& held = model["worlds"][std::to_string(world)][r];
    INFO(name << " rank " << r << " of " << world << " (" << ReadModeName(mode)
              << "): " << me.status.ToString());
    REQUIRE(me.status.ok());
    CHECK(me.handled_bytes == me.share.read_bytes);  // the reader read its share, no more
    read += me.share.read_bytes;
    CHECK(me.share.expert_bytes > 0);
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
    CheckAgainstTransformers(name, 2, ReadMode::kEachRank, EpCase(name)["ep_plan"].dump());
  }
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
  auto layers = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 0, .tp = 2,
                                               .pp_layers = {1, 1}});
  REQUIRE_FALSE(layers.ok());
  CHECK(layers.status().message().find("--pp P") != std::string::npos);
}

}  // namespace
}  // namespace loadstone
