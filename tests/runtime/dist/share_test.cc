// Tensor-parallel shares, loaded and exchanged, against transformers itself: the models of
// tests/fixtures/tp/models (saved by transformers' save_pretrained, every parameter holding its
// own element indices) loaded by each rank of 2, 3 and 4, the ranks' exchange run between
// threads (testing/local_exchange.h; the c10d one is tested across processes in
// tests/tools/dist). Each rank's tensor must hold exactly the indices transformers' loader gives
// that rank (tests/fixtures/tp/cases.json), and no split byte may be read by two ranks.
#include <catch2/catch.hpp>

#include <cstring>
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

namespace loadstone {
namespace {

using testing::kTpModels;

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

std::vector<float> Values(const Tensor& t) {
  std::vector<float> out;
  const uint64_t n = t.nbytes() / (t.dtype() == DType::kF32 ? 4 : 2);
  for (uint64_t i = 0; i < n; ++i) {
    if (t.dtype() == DType::kF32) {
      float v;
      std::memcpy(&v, t.data() + 4 * i, 4);
      out.push_back(v);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data() + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      out.push_back(v);
    }
  }
  return out;
}

struct RankResult {
  RankShare share;
  LoadPlan plan;
  std::vector<Tensor> tensors;
  Status status;
  uint64_t handled_bytes = 0;  // the reader's count: bytes read or copied from the page cache
};

// Every rank of `world` loads its share of `folder` and the group exchanges, one thread a rank.
std::vector<RankResult> LoadGroup(const std::string& folder, int world, const std::string& plan,
                                  DType dtype) {
  auto ckpt = Checkpoint::Open(folder);
  REQUIRE(ckpt.ok());
  Loader loader;
  testing::LocalGroup group(world);
  std::vector<RankResult> results;
  for (int r = 0; r < world; ++r) {
    // Several buckets of 300 bytes, even for these small models.
    const ParallelOptions par{world, r, world, plan, 300};
    auto share = ShareOf(*ckpt, par);
    REQUIRE(share.ok());
    PlanOptions options;
    options.dtype = dtype;
    auto load_plan = Plan(share->reads, RankPlanOptions(options));
    REQUIRE(load_plan.ok());
    results.push_back({std::move(*share), std::move(*load_plan), {}, Status::OK()});
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankResult& me = results[r];
      LoadHandle handle = loader.Load(me.share.reads, me.plan);
      me.status = handle.Done().get();
      if (!me.status.ok()) return;
      for (const RouteCount& c : handle.read_stats().routes) me.handled_bytes += c.bytes;
      auto member = group.member(r);
      auto tensors = AssembleShare(me.share, handle.Tensors(), member.get());
      if (!tensors.ok()) {
        me.status = tensors.status();
        return;
      }
      me.tensors = std::move(*tensors);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void CheckAgainstTransformers(const std::string& name, int world, const std::string& plan,
                              DType dtype) {
  const nlohmann::json& model = Model(name);
  const auto results = LoadGroup(kTpModels + name, world, plan, dtype);
  uint64_t read = 0;
  for (int r = 0; r < world; ++r) {
    const RankResult& me = results[r];
    INFO(name << " rank " << r << " of " << world << ": " << me.status.ToString());
    REQUIRE(me.status.ok());
    read += me.share.read_bytes;
    CHECK(me.plan.read_bytes == me.share.read_bytes);  // the plan reads its share, no more
    CHECK(me.handled_bytes == me.share.read_bytes);    // and so does the reader
    REQUIRE(me.tensors.size() == model["parameters"].size());
    for (const Tensor& t : me.tensors) {
      const nlohmann::json* found = nullptr;
      for (const auto& p : model["parameters"]) {
        if (p["name"].get<std::string>() == t.name()) found = &p;
      }
      REQUIRE(found != nullptr);
      const nlohmann::json& param = *found;
      INFO(param["name"] << " style " << param["style"]);
      CHECK(t.dtype() == dtype);
      std::vector<float> expected;
      for (uint64_t i : testing::TpIndices(param, world, r)) {
        expected.push_back(static_cast<float>(i));
      }
      CHECK(Values(t) == expected);
    }
  }
  // Split tensors read once in all, replicated ones by every rank.
  const RankShare& any = results[0].share;
  CHECK(read == any.split_bytes + world * any.replicated_bytes);
  CHECK(any.split_bytes > 0);
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
