// Scaled float8 weights: which weight is dequantized with which scales and block (plan.h,
// PlanOptions::fp8_block; specs/quant.md, "FP8 weights").
#ifndef LOADSTONE_RUNTIME_PLAN_FP8_PAIRS_H_
#define LOADSTONE_RUNTIME_PLAN_FP8_PAIRS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"

namespace loadstone::planning {

// A weight and the tensor its dequantization reads: float8 scales with the block one covers, or
// (Plan adds these) a bitsandbytes 4-bit weight's absmax, with no block.
struct ScalePair {
  size_t scale = 0;  // index into Checkpoint::tensors
  uint64_t block_rows = 0, block_cols = 0;
};

// The float8 weights to dequantize: weight index -> its scales and block (indices into
// Checkpoint::tensors). Only with a target dtype. DeepSeek-V3's `W_scale_inv` (f32) must fit
// `block` exactly; compressed-tensors' `W_scale` (f32, bf16 or f16) says by its shape whether
// it is per tensor, channel, group or block. Errors: InvalidArgument for a scale that fits no
// rule (naming both tensors and the fix) or a block with a zero side.
Result<std::map<size_t, ScalePair>> PairFp8Scales(const Checkpoint& checkpoint,
                                                  const PlanOptions& options,
                                                  std::array<uint64_t, 2> block);

// Adds the quantized weights with a quant state (PackedLayout::companions(): bitsandbytes,
// compressed-tensors) to `pairs`, each with its first companion (absmax, SCB, weight_scale) as
// its scales, and marks every companion in `keep_stored` (indexed like Checkpoint::tensors).
// Errors: InvalidArgument naming a companion the checkpoint lacks (a WithTensors view).
Status PairQuantStates(const Checkpoint& checkpoint, std::map<size_t, ScalePair>* pairs,
                       std::vector<bool>* keep_stored);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_FP8_PAIRS_H_
