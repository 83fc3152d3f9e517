// The plan's warnings about options: those that change nothing for this checkpoint (before the
// tensors are planned) and those that change nothing once the plan is made (LoadPlan::warnings).
#ifndef LOADSTONE_RUNTIME_PLAN_PLAN_WARNINGS_H_
#define LOADSTONE_RUNTIME_PLAN_PLAN_WARNINGS_H_

#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"

namespace loadstone::planning {

// keep_in_fp32 without a reduced target or matching nothing, packed tensors a target dtype
// cannot reach, align_tensors with mmap, special dtypes naming no tensor.
void WarnIneffective(const Checkpoint& checkpoint, const PlanOptions& options,
                     std::vector<std::string>* warnings);

// An offload folder nothing is written to, mmap for converted tensors, an unused fp8_block,
// max_memory with an explicit map.
void WarnUnused(const Checkpoint& checkpoint, const PlanOptions& options, const LoadPlan& plan,
                std::vector<std::string>* warnings);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_PLAN_WARNINGS_H_
