// Every rank of a tensor-parallel layout loading its share of a checkpoint in one process, one
// thread a rank, each group exchanging between threads (local_exchange.h): the harness of the
// share tests against transformers (tests/runtime/dist).
#ifndef LOADSTONE_TESTS_TESTING_TP_GROUP_H_
#define LOADSTONE_TESTS_TESTING_TP_GROUP_H_

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/tensor_parallel.h"
#include "testing/local_exchange.h"

namespace loadstone::testing {

inline std::vector<float> Values(const Tensor& t) {
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

// A group's layout: `world` ranks in tensor-parallel groups of `tp`, `pp` stages.
struct Layout {
  int world = 1;
  int tp = 1;
  int pp = 1;
  ReadMode mode = ReadMode::kEachRank;
  bool ep = false;  // expert parallelism over each tensor-parallel group
  std::string ep_plan;  // with ep: the plan given (ParallelOptions::ep_plan_json)
};

// Every rank loads its share of `folder` and each tensor-parallel group exchanges, one thread a
// rank.
inline std::vector<RankResult> LoadGroup(const std::string& folder, Layout l,
                                         const std::string& plan, DType dtype) {
  auto ckpt = Checkpoint::Open(folder);
  REQUIRE(ckpt.ok());
  Loader loader;
  std::vector<std::unique_ptr<testing::LocalGroup>> groups;
  for (int g = 0; g < l.world / l.tp; ++g) {
    groups.push_back(std::make_unique<testing::LocalGroup>(l.tp));
  }
  std::vector<RankResult> results;
  for (int r = 0; r < l.world; ++r) {
    // Several buckets of 300 bytes, even for these small models.
    const ParallelOptions par{.world_size = l.world, .rank = r, .tp = l.tp, .pp = l.pp,
                              .tp_plan_json = plan, .expert_parallel = l.ep,
                              .ep_plan_json = l.ep_plan, .bucket_bytes = 300,
                              .read_mode = l.mode};
    auto share = ShareOf(*ckpt, par);
    REQUIRE(share.ok());
    PlanOptions options;
    options.dtype = dtype;
    auto load_plan = Plan(share->reads, RankPlanOptions(options));
    REQUIRE(load_plan.ok());
    results.push_back({std::move(*share), std::move(*load_plan), {}, Status::OK()});
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < l.world; ++r) {
    threads.emplace_back([&, r] {
      RankResult& me = results[r];
      LoadHandle handle = loader.Load(me.share.reads, me.plan);
      me.status = handle.Done().get();
      if (!me.status.ok()) return;
      for (const RouteCount& c : handle.read_stats().routes) me.handled_bytes += c.bytes;
      auto member = groups[r / l.tp]->member(r % l.tp);
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

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_TP_GROUP_H_
