// Progress as a person sees it: bytes placed never pass bytes to place and end equal to them,
// whatever the conversion changes in size (mapped loads: loader_test.cc).
#include <algorithm>

#include <catch2/catch.hpp>

#include "loadstone/loader.h"
#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

struct Observed {
  Progress last;
  uint64_t most_placed = 0;  // the largest bytes_placed seen while loading
  bool over = false;         // bytes_placed > bytes_to_place at some sample
};

Observed LoadWatching(const Checkpoint& ckpt, const LoadPlan& plan, LoadOptions options = {}) {
  Loader loader;
  LoadHandle load = loader.Load(ckpt, plan, options);
  Observed seen;
  auto done = load.Done();
  while (done.wait_for(std::chrono::microseconds(200)) != std::future_status::ready) {
    const Progress p = load.progress();
    seen.most_placed = std::max(seen.most_placed, p.bytes_placed);
    seen.over = seen.over || p.bytes_placed > p.bytes_to_place;
  }
  REQUIRE(done.get().ok());
  seen.last = load.progress();
  seen.over = seen.over || seen.last.bytes_placed > seen.last.bytes_to_place;
  return seen;
}

TEST_CASE("progress: placed bytes end at exactly what the plan places, for every conversion") {
  TempDir dir;
  Checkpoint mixed = testing::WriteMixedCheckpoint(dir);
  TempDir fp8_dir;
  const auto fp8 = testing::WriteFp8Checkpoint(fp8_dir);
  struct Case {
    const char* what;
    const Checkpoint* ckpt;
    std::optional<DType> dtype;
  };
  for (const Case& c : {Case{"as stored", &mixed, std::nullopt}, Case{"up to f32", &mixed, DType::kF32},
                        Case{"down to f16", &mixed, DType::kF16},
                        Case{"float8 dequant to bf16", &fp8.ckpt, DType::kBF16}}) {
    INFO(c.what);
    PlanOptions po;
    po.dtype = c.dtype;
    auto plan = Plan(*c.ckpt, po);
    REQUIRE(plan.ok());
    if (c.dtype) CHECK(plan->placed_bytes != plan->read_bytes);  // the sizes really differ
    const Observed seen = LoadWatching(*c.ckpt, *plan);
    CHECK_FALSE(seen.over);
    CHECK(seen.last.bytes_to_place == plan->placed_bytes);
    CHECK(seen.last.bytes_placed == plan->placed_bytes);
    CHECK(seen.last.bytes_total == plan->read_bytes);
    CHECK(seen.last.bytes_read == plan->read_bytes);
    CHECK(seen.last.tensors_done == seen.last.tensors_total);
    CHECK(seen.last.eta_seconds == 0);
  }
}

}  // namespace
}  // namespace loadstone
