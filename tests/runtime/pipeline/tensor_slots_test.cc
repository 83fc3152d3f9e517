// pipeline::TensorSlots on its own: placed bytes add up to exactly the plan's placed bytes
// whatever the pieces (a cast changes the size), a tensor is whole once, FailRest resolves only
// the tensors not whole, and names outside the load (or of a refused plan) are not found.
#include "runtime/pipeline/tensor_slots.h"

#include <chrono>

#include <catch2/catch.hpp>

#include "tests/runtime/pipeline/test_model.h"

namespace loadstone {
namespace {

using pipeline::TensorSlots;
using testing::TempDir;

TEST_CASE("tensor slots: uneven pieces add up to the placed bytes, each tensor whole once") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.dtype = DType::kF32;  // the bf16 and f16 tensors grow: placed != source bytes
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  REQUIRE(plan->placed_bytes != ckpt.total_bytes());
  TensorSlots slots(ckpt, *plan, /*indexed=*/true);
  REQUIRE(slots.size() == plan->tensors.size());
  for (uint32_t t = 0; t < slots.size(); ++t) {
    const uint64_t source = ckpt.tensors()[plan->tensors[t].source].nbytes;
    INFO(ckpt.tensors()[plan->tensors[t].source].name << ": " << source << " bytes");
    if (source == 0) {
      CHECK(slots.empty(t));
      CHECK(slots.Place(t, 0));
    } else {
      CHECK_FALSE(slots.empty(t));
      // Pieces of 1 byte, a third of the rest, then the rest: no rounding may lose a byte.
      const uint64_t first = 1, second = (source - first) / 3;
      CHECK(slots.Place(t, first) == (source == first));
      if (source > first) {
        CHECK(slots.Place(t, second) == (second == source - first));
        if (source - first - second > 0) CHECK(slots.Place(t, source - first - second));
      }
    }
    CHECK(slots.done(t));
    CHECK_FALSE(slots.Place(t, 0));  // whole once
    slots.Resolve(t, Tensor());
  }
  CHECK(slots.bytes_placed() == plan->placed_bytes);
  CHECK(slots.all_done());
  CHECK(slots.tensors_done() == slots.size());
}

TEST_CASE("tensor slots: FailRest resolves only what is not whole, names outside the load are not found") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.include = [](const TensorInfo& t) { return t.name != "lm_head.weight"; };
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  TensorSlots slots(ckpt, *plan, /*indexed=*/true);
  CHECK_FALSE(slots.IndexOf("lm_head.weight"));  // in the checkpoint, not in this load
  CHECK_FALSE(slots.IndexOf("no such tensor"));
  const auto first = slots.IndexOf(ckpt.tensors()[plan->tensors[0].source].name);
  REQUIRE(first);
  CHECK(*first == 0);
  REQUIRE(slots.Place(0, ckpt.tensors()[plan->tensors[0].source].nbytes));
  slots.Resolve(0, Tensor());
  slots.FailRest(Status::Cancelled("the load was cancelled"));
  using std::chrono::seconds;
  REQUIRE(slots.future(0).wait_for(seconds(0)) == std::future_status::ready);
  CHECK_NOTHROW(slots.future(0).get());
  for (uint32_t t = 1; t < slots.size(); ++t) {
    REQUIRE(slots.future(t).wait_for(seconds(0)) == std::future_status::ready);
    CHECK_THROWS_AS(slots.future(t).get(), Error);
    CHECK(slots.data(t) == nullptr);
  }
  CHECK_FALSE(slots.all_done());
  // A plan that failed its checks indexes nothing: no name is found, no slot waits for bytes.
  TensorSlots refused(ckpt, *plan, /*indexed=*/false);
  CHECK_FALSE(refused.IndexOf(ckpt.tensors()[plan->tensors[0].source].name));
  CHECK(refused.empty(0));
}

}  // namespace
}  // namespace loadstone
