// Read routes: the plan gives each read one from its tensor and the ReadRouteOptions, and the
// two rules of runtime/pipeline/routes.h settle the routes that name two.
#include "runtime/pipeline/routes.h"

#include <catch2/catch.hpp>

#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

// The route of every read of tensor `name` (each the same).
ReadRoute RouteOf(const Checkpoint& ckpt, const LoadPlan& plan, const std::string& name) {
  std::optional<ReadRoute> route;
  for (const ReadChunk& r : plan.reads) {
    for (uint32_t t : r.tensors) {
      if (ckpt.tensors()[plan.tensors[t].source].name != name) continue;
      if (route) CHECK(*route == r.route);
      route = r.route;
    }
  }
  REQUIRE(route.has_value());
  return *route;
}

TEST_CASE("routes: each read's route follows from its tensor and the route options") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  const std::string large = "model.embed_tokens.weight";  // bf16, ~20 MiB, CPU
  const std::string small = "model.layers.0.attn.q.bias";  // shares its neighbours' buffer
  REQUIRE(ckpt.Find(large)->nbytes > (1 << 20));
  REQUIRE(ckpt.Find(small)->nbytes < (64 << 10));
  PlanOptions po;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  CHECK(RouteOf(ckpt, *plan, large) == ReadRoute::kFreshPages);
  const ReadRoute small_route = RouteOf(ckpt, *plan, small);  // its shared buffer's route
  CHECK((small_route == ReadRoute::kFreshPages || small_route == ReadRoute::kStagedWhenCold));
  CHECK(plan->tensors[0].device == 0);
  CHECK(plan->targets == std::vector<Device>{Device::Cpu()});

  po.routes.fill_fresh_pages = false;
  CHECK(RouteOf(ckpt, *Plan(ckpt, po), large) == ReadRoute::kStagedWhenCold);
  po.routes.stage_cold_reads = false;
  CHECK(RouteOf(ckpt, *Plan(ckpt, po), large) == ReadRoute::kInPlace);
  po.routes.mmap = true;
  auto mapped = Plan(ckpt, po);
  REQUIRE(mapped.ok());
  CHECK(RouteOf(ckpt, *mapped, large) == ReadRoute::kMapped);
  CHECK(RouteOf(ckpt, *mapped, small) == ReadRoute::kMapped);  // nothing read, nothing coalesced

  PlanOptions cast;  // converted: staged whatever the options
  cast.dtype = DType::kF16;
  cast.routes.mmap = true;
  CHECK(RouteOf(ckpt, *Plan(ckpt, cast), large) == ReadRoute::kStaged);
  PlanOptions gpu;  // on a device: staged
  gpu.device_map = "cuda:0";
  CHECK(RouteOf(ckpt, *Plan(ckpt, gpu), large) == ReadRoute::kStaged);

  // The plan's text and route totals say the same.
  const auto totals = plan->RouteTotals();
  size_t reads = 0;
  for (const RouteCount& count : totals) reads += count.reads;
  CHECK(reads == plan->reads.size());
  CHECK_THAT(plan->ToString(), Catch::Contains("fresh pages: "));
  CHECK_THAT(Plan(ckpt, cast)->ToString(), Catch::Contains("staged: "));
}

TEST_CASE("routes: at the start, a Loader without fresh pages or direct I/O changes them") {
  using pipeline::RouteAtStart;
  using pipeline::StartFacts;
  const ReadRouteOptions defaults;
  ReadRouteOptions no_stage;
  no_stage.stage_cold_reads = false;
  const StartFacts all{true, true}, no_fresh{false, true}, buffered{true, false};
  CHECK(RouteAtStart(ReadRoute::kFreshPages, defaults, all) == ReadRoute::kFreshPages);
  CHECK(RouteAtStart(ReadRoute::kFreshPages, defaults, no_fresh) == ReadRoute::kStagedWhenCold);
  CHECK(RouteAtStart(ReadRoute::kFreshPages, no_stage, no_fresh) == ReadRoute::kInPlace);
  CHECK(RouteAtStart(ReadRoute::kFreshPages, defaults, {false, false}) == ReadRoute::kInPlace);
  CHECK(RouteAtStart(ReadRoute::kFreshPages, defaults, buffered) == ReadRoute::kFreshPages);
  CHECK(RouteAtStart(ReadRoute::kStagedWhenCold, defaults, buffered) == ReadRoute::kInPlace);
  CHECK(RouteAtStart(ReadRoute::kStagedWhenCold, defaults, all) == ReadRoute::kStagedWhenCold);
  for (ReadRoute fixed : {ReadRoute::kInPlace, ReadRoute::kStaged, ReadRoute::kMapped}) {
    CHECK(RouteAtStart(fixed, defaults, {false, false}) == fixed);
  }
}

TEST_CASE("routes: at its turn, where the bytes are settles the route taken") {
  using pipeline::RouteAtTurn;
  CHECK(RouteAtTurn(ReadRoute::kFreshPages, {.cached = true}) == ReadRoute::kPageCacheCopy);
  CHECK(RouteAtTurn(ReadRoute::kFreshPages, {.cached = false, .cold = true}) == ReadRoute::kStaged);
  CHECK(RouteAtTurn(ReadRoute::kStagedWhenCold, {.cold = true}) == ReadRoute::kStaged);
  CHECK(RouteAtTurn(ReadRoute::kStagedWhenCold, {}) == ReadRoute::kInPlace);
  // `cached` is asked of reads into the caller's memory (ReadStage::Pump): a worker copies those.
  CHECK(RouteAtTurn(ReadRoute::kStagedWhenCold, {.cached = true}) == ReadRoute::kPageCacheCopy);
  CHECK(RouteAtTurn(ReadRoute::kInPlace, {.cached = true}) == ReadRoute::kPageCacheCopy);
  CHECK(RouteAtTurn(ReadRoute::kInPlace, {}) == ReadRoute::kInPlace);
  for (ReadRoute fixed : {ReadRoute::kStaged, ReadRoute::kMapped}) {
    CHECK(RouteAtTurn(fixed, {true, true}) == fixed);
  }
  CHECK(ReadRouteName(ReadRoute::kStagedWhenCold) == "staged when cold");
  CHECK(ReadRouteName(ReadRoute::kPageCacheCopy) == "page-cache copy");
}

}  // namespace
}  // namespace loadstone
