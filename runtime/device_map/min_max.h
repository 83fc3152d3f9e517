// The min-max strategy: a contiguous partition of the layer sequence over the GPUs that
// minimises the largest per-GPU load (binary search on the answer), then cpu, then disk.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_MIN_MAX_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_MIN_MAX_H_

#include <cstdint>
#include <vector>

#include "runtime/device_map/greedy.h"

namespace loadstone::device_map {

// Splits `sizes` (in order) over parts with capacities `caps` (in order), each part a contiguous
// run, every element placed, minimising the largest part. Returns the number of elements in each
// part, or an empty vector when no partition fits.
std::vector<size_t> MinMaxPartition(const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& caps);

// The layers (tensors, childless or no-split modules, split modules expanded into params,
// children and buffers), with modules that share a tied parameter pulled next to the first.
// The same budgets as the greedy planner (before balancing), the same reserve on the first GPU
// for an offloaded layer.
Placement MinMaxPlace(const PlanContext& ctx, const Budgets& budgets);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_MIN_MAX_H_
