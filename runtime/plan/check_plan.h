// Whether a LoadPlan can be carried out on a checkpoint as it is: a plan is a value a program may
// keep, copy, edit or build by hand, so the Loader checks it before it uses any index, size or
// route in it — a plan made by Plan() for this checkpoint always passes.
#ifndef LOADSTONE_RUNTIME_PLAN_CHECK_PLAN_H_
#define LOADSTONE_RUNTIME_PLAN_CHECK_PLAN_H_

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"

namespace loadstone::planning {

// InvalidArgument, saying what is wrong and to plan again, when:
// - the plan was made for another checkpoint (LoadPlan::checkpoint_fingerprint);
// - an index points nowhere (a tensor, a file, a target, float8 scales), a tensor is planned
//   twice, or its size, dtype and conversion do not agree with the catalog;
// - a read is outside its file, or its tensors' bytes are not read exactly once, in file order
//   (every planned tensor's bytes covered by its reads, no byte twice: else a load would never
//   finish);
// - a route does not fit its read: kPageCacheCopy planned, an unstaged route for a converted,
//   device or coalesced tensor, kMapped without ReadRouteOptions::mmap, kFreshPages for memory
//   that is not fresh pages, a fresh-pages tensor read by the reader, a shared buffer that is not
//   its tensors' bytes back to back;
// - a dequantized packed tensor read in pieces that cut its blocks;
// - memory given from elsewhere (TensorPlan::caller_memory, pinned) off the CPU, in fresh pages,
//   mapped or in a shared buffer, or both at once;
// - a tensor's memory or conversion site is not what its device, flags and reads make it.
Status CheckPlanFor(const Checkpoint& checkpoint, const LoadPlan& plan);

// OK when every tensor's TensorPlan::memory is the kind its device, flags and reads make it
// (memory.cc, the rule ChooseMemory applies); else InvalidArgument naming the first that is not.
// Part of CheckPlanFor.
Status CheckMemory(const Checkpoint& checkpoint, const LoadPlan& plan);

// OK when every tensor's TensorPlan::conversion_site is the one its conversion, layout and device
// make it (site.cc, the rule ChooseConversionSites applies; for a quantized weight on a GPU either
// the device or the CPU then the device); else InvalidArgument naming the first that is not.
// Part of CheckPlanFor.
Status CheckConversionSites(const Checkpoint& checkpoint, const LoadPlan& plan);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_CHECK_PLAN_H_
