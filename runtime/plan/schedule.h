// The order and the read schedule of a LoadPlan (plan.h): which tensor comes first, which go
// into fresh pages, and every read with its route. Plan() (plan.cc) calls these once the
// tensors' devices, dtypes and conversions are known.
#ifndef LOADSTONE_RUNTIME_PLAN_SCHEDULE_H_
#define LOADSTONE_RUNTIME_PLAN_SCHEDULE_H_

#include <cstddef>
#include <vector>

#include "loadstone/plan.h"

namespace loadstone::planning {

// The most bytes a strided tensor (with the tensors that share its bytes) may span: it is staged
// whole, and staging slots are as large as the largest staged read.
inline constexpr uint64_t kMaxRelayoutSpan = 256ULL << 20;

// Small tensors this far apart in their file or closer are read together, the gap with them
// (LoadPlan::read_bytes counts it): what lies between two storages of a PyTorch archive. The most
// PlanOptions::coalesce_gap may allow.
inline constexpr uint64_t kCoalesceGap = 4096;

// LoadPlan::targets from the device of each planned tensor (`device_of[i]` holds tensor i),
// and TensorPlan::device as an index into it.
void IndexTargets(const std::vector<Device>& device_of, LoadPlan* plan);

// Tensor `t` lands on the CPU as its bytes are in the file: the tensors whose reads may skip
// staging (in place, fresh pages, mapped, a shared buffer).
inline bool IsUnconvertedCpu(const LoadPlan& plan, uint32_t t) {
  return plan.tensors[t].conversion == Conversion::kNone && plan.device_of(t) == Device::Cpu();
}

// The route of an unconverted CPU read that would go into fresh pages, where there are none
// (fill_fresh_pages off, or userfaultfd refused at run time: routes.h, RouteAtStart).
ReadRoute RouteWithoutFreshPages(const ReadRouteOptions& routes);

// TensorPlan::fresh_pages: CPU tensors of 64 KiB and more, unless mapped, when
// plan->routes.fill_fresh_pages.
void ChooseFreshPages(LoadPlan* plan);

// LoadPlan::reads and read_bytes: large tensors in pieces of max_chunk, each routed by its
// tensor and plan->routes (staged for a device or a conversion); small ones coalesced with their
// file neighbours, into shared buffers where they need no conversion (ReadChunk::shared_buffer,
// whose tensors' fresh_pages it sets), else into staged reads (mapped ones are not read, so
// never coalesced); reads in the priority order of their first tensor. `is_scale[i]`:
// checkpoint tensor i is a float8 weight's scales (never coalesced, so that it is read before
// its weight).
//
// Tensors whose bytes overlap in the file (views of one PyTorch storage, tied weights) are read
// once: their union in pieces of max_chunk, through staging, each piece listing every tensor it
// holds a part of. A strided tensor (TensorInfo::strides) is read in one piece, whatever
// max_chunk, with the tensors that overlap it: Unsupported when that is more than
// kMaxRelayoutSpan bytes. Then each tensor's memory (ChooseMemory).
Status ScheduleReads(const std::vector<TensorInfo>& infos, const std::vector<bool>& is_scale,
                     const PlanOptions& options, LoadPlan* plan);

// TensorPlan::memory of every tensor, from its device, its flags and its reads' routes (after
// ScheduleReads): device, caller, pinned, mapped, shared (a shared-buffer read's), fresh pages,
// arena (under kArenaTensorMax, every read staged), else host.
void ChooseMemory(LoadPlan* plan);

// TensorPlan::conversion_site of every tensor (site.cc), from its conversion, its layout and its
// device: none, the CPU, the device, or the CPU then the device (a relayout; a quantized weight
// on a GPU that `platform` says does not decode it, PlatformGpu::decodes_quantized).
void ChooseConversionSites(const Checkpoint& checkpoint, const Platform& platform, LoadPlan* plan);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_SCHEDULE_H_
