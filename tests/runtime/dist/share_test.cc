// Tensor-parallel shares, loaded and exchanged, against transformers itself: the models of
// tests/fixtures/tp/models (saved by transformers' save_pretrained, every parameter holding its
// own element indices) loaded by each rank of 2, 3 and 4, the ranks' exchange run between
// threads (testing/local_exchange.h; the c10d one is tested across processes in
// tests/tools/dist). Each rank's tensor must hold exactly the indices transformers' loader gives
// that rank (tests/fixtures/tp/cases.json), and no split byte may be read by two ranks.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/tensor_parallel.h"
#include "testing/local_exchange.h"
#include "testing/tp_cases.h"
#include "testing/tp_group.h"

namespace loadstone {
namespace {

using testing::kTpModels;
using testing::Layout;
using testing::LoadGroup;
using testing::RankResult;
using testing::Values;

const nlohmann::json& Model(const std::string& name) {
  const nlohmann::json& model = testing::TpCase(name);
  REQUIRE(model.is_object());
  return model;
}

// The plan of the "by-hand" case as a user gives it (--tp-plan).
std::string PlanJson(const nlohmann::json& model) {
  nlohmann::ordered_json plan = nlohmann::ordered_json::object();
  for (const auto& entry : model["tp_plan"]) plan[entry[0].get<std::string>()] = entry[1];
  return plan.dump();
}

// The stage of parameter `name` of the fixtures' 2-layer models, written out (not computed by
// the rule under test): pp 2 — the embeddings and layer 0 first, layer 1, the norm and the head
// last (vLLM's split of 2 layers: {0, 1}, {1, 2}).
int StageOfTwoLayers(const std::string& name, int pp) {
  if (pp == 1) return 0;
  if (name.starts_with("model.embed_tokens.") || name.starts_with("model.layers.0.")) return 0;
  return 1;
}

void CheckAgainstTransformers(const std::string& name, Layout l, const std::string& plan,
                              DType dtype) {
  const nlohmann::json& model = Model(name);
  const auto results = LoadGroup(kTpModels + name, l, plan, dtype);
  uint64_t read = 0;
  uint64_t bound = 0;  // split tensors once, replicated ones by each rank of their stage
  for (int r = 0; r < l.world; ++r) {
    const RankResult& me = results[r];
    const int tp_rank = r % l.tp;
    const int stage = (r / l.tp) % l.pp;
    INFO(name << " rank " << r << " of " << l.world << " (tp " << l.tp << ", pp " << l.pp
              << "): " << me.status.ToString());
    REQUIRE(me.status.ok());
    CHECK(me.share.stage == stage);
    read += me.share.read_bytes;
    const bool once = l.mode == ReadMode::kOnce;
    if (r < l.tp * l.pp && tp_rank == 0) {
      bound += me.share.split_bytes + (once ? 1 : l.tp) * me.share.replicated_bytes;
    }
    if (once && tp_rank != 0) CHECK(me.share.read_bytes == 0);  // the first rank reads for all
    CHECK(me.plan.read_bytes == me.share.read_bytes);  // the plan reads its share, no more
    CHECK(me.handled_bytes == me.share.read_bytes);    // and so does the reader
    size_t on_stage = 0;
    for (const auto& p : model["parameters"]) {
      on_stage += StageOfTwoLayers(p["name"].get<std::string>(), l.pp) == stage ? 1 : 0;
    }
    REQUIRE(me.tensors.size() == on_stage);
    for (const Tensor& t : me.tensors) {
      const nlohmann::json* found = nullptr;
      for (const auto& p : model["parameters"]) {
        if (p["name"].get<std::string>() == t.name()) found = &p;
      }
      REQUIRE(found != nullptr);
      const nlohmann::json& param = *found;
      INFO(param["name"] << " style " << param["style"]);
      CHECK(StageOfTwoLayers(t.name(), l.pp) == stage);
      CHECK(t.dtype() == dtype);
      std::vector<float> expected;
      for (uint64_t i : testing::TpIndices(param, l.tp, tp_rank)) {
        expected.push_back(static_cast<float>(i));
      }
      CHECK(Values(t) == expected);
    }
  }
  // Split tensors read once in each pipeline, replicated ones by every rank of their stage (read
  // once: by its first rank only).
  CHECK(read == (l.world / (l.tp * l.pp)) * bound);
  if (l.tp > 1) CHECK(results[0].share.split_bytes > 0);
}

void CheckAgainstTransformers(const std::string& name, int world, const std::string& plan,
                              DType dtype) {
  CheckAgainstTransformers(name, Layout{world, world, 1}, plan, dtype);
}

TEST_CASE("tensor parallel: each rank of 2, 3, 4 holds transformers' part (sharded Llama)") {
  for (int world : {2, 3, 4}) {
    CheckAgainstTransformers("llama", world, "", DType::kF32);
  }
  CheckAgainstTransformers("llama", 4, "", DType::kBF16);  // cast before the exchange
  // Rank 2 of 3 holds nothing of k_proj [4, 8] (torch.chunk: 2, 2, 0 rows): still a bf16 part.
  CheckAgainstTransformers("llama", 3, "", DType::kBF16);
}

TEST_CASE("tensor parallel: a plan given by hand, every style (packed, embedding_colwise, rep)") {
  const std::string plan = PlanJson(Model("by-hand"));
  for (int world : {2, 4}) {
    CheckAgainstTransformers("by-hand", world, plan, DType::kF32);
  }
  CheckAgainstTransformers("by-hand", 2, plan, DType::kBF16);
}

TEST_CASE("tensor × pipeline parallel: each stage holds its layers, each rank its part of them") {
  CheckAgainstTransformers("llama", Layout{4, 2, 2}, "", DType::kF32);
  CheckAgainstTransformers("llama", Layout{2, 1, 2}, "", DType::kF32);
  CheckAgainstTransformers("llama", Layout{8, 2, 2}, "", DType::kBF16);  // two pipelines
  CheckAgainstTransformers("by-hand", Layout{4, 2, 2}, PlanJson(Model("by-hand")), DType::kF32);
}

TEST_CASE("read once: a group's first rank reads each tensor once and sends every part") {
  for (int world : {2, 3, 4}) {
    CheckAgainstTransformers("llama", Layout{world, world, 1, ReadMode::kOnce}, "", DType::kF32);
  }
  CheckAgainstTransformers("llama", Layout{4, 2, 2, ReadMode::kOnce}, "", DType::kBF16);
  CheckAgainstTransformers("by-hand", Layout{4, 4, 1, ReadMode::kOnce},
                           PlanJson(Model("by-hand")), DType::kF32);
  auto ckpt = Checkpoint::Open(kTpModels + "llama");
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .tp = 2,
                                              .read_mode = ReadMode::kAuto});
  REQUIRE_FALSE(share.ok());
  CHECK_THAT(std::string(share.status().message()), Catch::Contains("chosen by LoadRank"));
}

TEST_CASE("tensor parallel: a quantized or float8 weight a rule splits is refused, by name") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/";
  struct Case {
    std::string path;
    std::string plan;
    std::string tensor;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"gptq/awq4_g32", R"({"layer": "colwise"})", "layer.qweight", "packed"},
           {"ct/float.safetensors", R"({"f8_channel": "colwise"})", "f8_channel.weight",
            "float8 weight with scales"}}) {
    auto ckpt = Checkpoint::Open(fixtures + c.path);
    REQUIRE(ckpt.ok());
    auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .tp = 2, .tp_plan_json = c.plan});
    INFO(c.path);
    REQUIRE_FALSE(share.ok());
    CHECK(share.status().code() == StatusCode::kUnsupported);
    CHECK_THAT(std::string(share.status().message()),
               Catch::Contains("tensor '" + c.tensor + "'") && Catch::Contains(c.why) &&
                   Catch::Contains("give a plan that replicates it"));
    // Replicated (no rule), the same checkpoint loads whole on every rank.
    share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .tp = 2, .tp_plan_json = "{}"});
    REQUIRE(share.ok());
    CHECK(share->split_bytes == 0);
    CHECK(share->read_bytes == share->replicated_bytes);
  }
}

TEST_CASE("read once: a float8 weight with scales and its scales are read by every rank") {
  auto ckpt = Checkpoint::Open(std::string(LOADSTONE_SOURCE_DIR) +
                               "/tests/fixtures/ct/float.safetensors");
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 1, .tp = 2,
                                              .tp_plan_json = "{}",
                                              .read_mode = ReadMode::kOnce});
  REQUIRE(share.ok());
  for (const char* name : {"f8_channel.weight", "f8_channel.weight_scale"}) {
    INFO(name);
    const TensorInfo* read = share->reads.Find(name);
    REQUIRE(read != nullptr);
    CHECK(read->nbytes == ckpt->Find(name)->nbytes);  // whole, as stored, on rank 1 too
    CHECK(read->shape == ckpt->Find(name)->shape);
  }
  // ... so that a cast to bf16 still pairs each weight with its scales.
  PlanOptions options;
  options.dtype = DType::kBF16;
  CHECK(Plan(share->reads, RankPlanOptions(options)).ok());
}

// A float8 checkpoint with scales (compressed-tensors: per tensor, channel, group, 128 × 128
// block) on 2 ranks, cast to bf16, each rank reading its own or read once: every rank holds
// every weight whole (no rule splits them), dequantized as compressed-tensors dequantizes them
// (float_expected.safetensors, its producer's values).
TEST_CASE("tensor parallel: a float8 checkpoint, replicated, dequantized on every rank") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/ct/";
  const auto expected = LoadGroup(fixtures + "float_expected.safetensors", Layout{}, "",
                                  DType::kBF16);
  REQUIRE(expected[0].status.ok());
  for (const ReadMode mode : {ReadMode::kEachRank, ReadMode::kOnce}) {
    const auto results = LoadGroup(fixtures + "float.safetensors", Layout{2, 2, 1, mode}, "{}",
                                   DType::kBF16);
    for (const RankResult& me : results) {
      INFO("rank " << me.share.tp_rank << " " << ReadModeName(mode) << ": "
                   << me.status.ToString());
      REQUIRE(me.status.ok());
      size_t weights = 0;
      for (const Tensor& t : me.tensors) {
        if (!t.name().ends_with(".weight")) continue;
        INFO(t.name());
        ++weights;
        const Tensor* want = nullptr;
        for (const Tensor& e : expected[0].tensors) {
          if (e.name() == t.name() + ".bf16") want = &e;
        }
        REQUIRE(want != nullptr);
        CHECK(t.shape() == want->shape());
        CHECK(Values(t) == Values(*want));
      }
      CHECK(weights == 4);
    }
  }
}

TEST_CASE("read modes: the cost model takes the faster of each-rank and once") {
  auto ckpt = Checkpoint::Open(kTpModels + "llama");
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 4, .tp = 4});
  REQUIRE(share.ok());
  RankShare each = *share;  // its bytes replaced by round numbers
  each.split_bytes = 1000;
  each.exchanged_bytes = 400;
  each.replicated_bytes = 500;
  // Storage 100 B/s for the group, link 1000 B/s a rank: each reads 1000 + 4 × 500 = 3000 B
  // (30 s) and receives 400 / 4 × 3 / 4 = 75 B (0.075 s); once reads 1500 B (15 s) and its first
  // rank sends 750 + 1500 B (2.25 s).
  ReadModeCost cost = EstimateReadModes(each, 100, 1000);
  CHECK(cost.each_seconds == Approx(30.075));
  CHECK(cost.once_seconds == Approx(17.25));
  // A link as slow as the storage: once sends 2250 B at 100 B/s (22.5 s + 15 s): each wins.
  cost = EstimateReadModes(each, 100, 100);
  CHECK(cost.each_seconds == Approx(30.75));
  CHECK(cost.once_seconds == Approx(37.5));
}

TEST_CASE("tensor parallel: a column-wise part is read as one range and handed over as loaded") {
  auto ckpt = Checkpoint::Open(kTpModels + "llama");
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{2, 1, 2});
  REQUIRE(share.ok());
  const TensorInfo* full = ckpt->Find("model.layers.0.self_attn.q_proj.weight");
  const TensorInfo* part = share->reads.Find("model.layers.0.self_attn.q_proj.weight");
  REQUIRE(full != nullptr);
  REQUIRE(part != nullptr);
  CHECK(part->shape == std::vector<uint64_t>{4, 8});  // rows 4..7 of [8, 8]
  CHECK(part->offset == full->offset + 4 * 8 * 4);
  const TensorInfo* down = share->reads.Find("model.layers.0.mlp.down_proj.weight");
  REQUIRE(down != nullptr);  // row-wise [8, 10]: its second half of 80 elements, in a block
  CHECK(down->shape == std::vector<uint64_t>{40});
  CHECK(down->offset == ckpt->Find("model.layers.0.mlp.down_proj.weight")->offset + 40 * 4);
  for (const TensorShard& s : share->tensors) {
    if (s.name == "model.layers.0.mlp.down_proj.weight") {
      CHECK(s.exchanged);
      CHECK(s.shape == std::vector<uint64_t>{8, 5});
    }
    if (s.name == "model.norm.weight") CHECK(s.style.empty());
  }
}

TEST_CASE("tensor parallel: options that do not fit, a plan that does not parse, no exchange") {
  auto ckpt = Checkpoint::Open(kTpModels + "llama");
  REQUIRE(ckpt.ok());
  ParallelOptions par{4, 0, 3};
  auto share = ShareOf(*ckpt, par);
  REQUIRE_FALSE(share.ok());
  CHECK(share.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(share.status().message()),
             Catch::Contains("does not divide the world size 4"));
  par.tp = 4;
  par.rank = 4;
  CHECK(ShareOf(*ckpt, par).status().code() == StatusCode::kInvalidArgument);
  par.rank = 0;
  par.tp_plan_json = R"({"model.layers.*.mlp.down_proj": "diagonal"})";
  share = ShareOf(*ckpt, par);
  REQUIRE_FALSE(share.ok());
  CHECK_THAT(std::string(share.status().message()), Catch::Contains("diagonal"));
  CHECK_THAT(std::string(share.status().message()), Catch::Contains("tensor-parallel plan given"));
  par.tp_plan_json.clear();
  share = ShareOf(*ckpt, par);
  REQUIRE(share.ok());
  Loader loader;
  auto plan = Plan(share->reads);
  REQUIRE(plan.ok());
  LoadHandle handle = loader.Load(share->reads, *plan);
  REQUIRE(handle.Done().get().ok());
  auto tensors = AssembleShare(*share, handle.Tensors(), nullptr);
  REQUIRE_FALSE(tensors.ok());
  CHECK_THAT(std::string(tensors.status().message()),
             Catch::Contains("needs an exchange of its group"));
}

}  // namespace
}  // namespace loadstone
