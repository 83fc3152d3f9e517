// ChooseMemory / CheckMemory: each planned tensor's memory kind (TensorPlan::memory), once its
// reads are scheduled — the decision Destinations carries out at load time — by one rule.
#include <fmt/format.h>

#include "runtime/plan/check_plan.h"
#include "runtime/plan/schedule.h"

namespace loadstone::planning {
namespace {

// Per tensor: it is in a shared-buffer read; every read of it is staged.
struct ReadFacts {
  std::vector<bool> shared, staged_only;
};

ReadFacts FactsOf(const LoadPlan& plan) {
  ReadFacts facts{std::vector<bool>(plan.tensors.size()),
                  std::vector<bool>(plan.tensors.size(), true)};
  for (const ReadChunk& read : plan.reads) {
    for (uint32_t t : read.tensors) {
      if (t >= plan.tensors.size()) continue;  // CheckCoverage names it
      if (read.shared_buffer) facts.shared[t] = true;
      if (read.route != ReadRoute::kStaged) facts.staged_only[t] = false;
    }
  }
  return facts;
}

TensorMemory MemoryFor(const LoadPlan& plan, uint32_t t, const ReadFacts& facts) {
  const TensorPlan& tp = plan.tensors[t];
  if (plan.device_of(t) != Device::Cpu()) return TensorMemory::kDevice;
  if (tp.caller_memory) return TensorMemory::kCaller;
  if (tp.pinned) return TensorMemory::kPinned;
  if (plan.routes.mmap && tp.conversion == Conversion::kNone) return TensorMemory::kMapped;
  if (facts.shared[t]) return TensorMemory::kShared;
  if (tp.fresh_pages) return TensorMemory::kFreshPages;
  if (tp.nbytes < kArenaTensorMax && facts.staged_only[t]) return TensorMemory::kArena;
  return TensorMemory::kHost;
}

}  // namespace

void ChooseMemory(LoadPlan* plan) {
  const ReadFacts facts = FactsOf(*plan);
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) {
    plan->tensors[t].memory = MemoryFor(*plan, t, facts);
  }
}

Status CheckMemory(const Checkpoint& checkpoint, const LoadPlan& plan) {
  const ReadFacts facts = FactsOf(plan);
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorMemory want = MemoryFor(plan, t, facts);
    if (plan.tensors[t].memory == want) continue;
    return Status::InvalidArgument(fmt::format(
        "this plan cannot be loaded: tensor '{}' is planned into {} memory, but its device, "
        "flags and reads make it {}; plan it again with Plan()",
        checkpoint.tensors()[plan.tensors[t].source].name,
        TensorMemoryName(plan.tensors[t].memory), TensorMemoryName(want)));
  }
  return Status::OK();
}

}  // namespace loadstone::planning
