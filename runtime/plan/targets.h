// What each tensor of a checkpoint becomes — its dtype and conversion — before any device is
// known: the target-dtype rules of a plan (plan.h: dtype, keep_in_fp32, special dtypes, float8
// scales, quantized weights dequantized or kept packed).
#ifndef LOADSTONE_RUNTIME_PLAN_TARGETS_H_
#define LOADSTONE_RUNTIME_PLAN_TARGETS_H_

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "runtime/plan/fp8_pairs.h"

namespace loadstone::planning {

constexpr bool IsReducedFloat(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

// The dtype and conversion of one tensor, whatever its device.
struct Target {
  DType dtype = DType::kF32;
  Conversion conversion = Conversion::kNone;
};

// Elements of `t` once loaded by `conversion`: a dequantized packed tensor has those of its
// element shape; any other tensor those of its catalog shape (a packed one's bytes).
uint64_t PlacedElements(const TensorInfo& t, Conversion conversion);

// The conversion that decodes packed tensor `t` into `to`, or kNone when loadstone cannot.
// REQUIRES: t.packed.
Conversion DequantOf(const TensorInfo& t, DType to);

// The quantized types loadstone decodes, for messages.
inline constexpr std::string_view kDecodable =
    "GGUF Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K blocks, bitsandbytes nf4/fp4/int8 "
    "and compressed-tensors pack-quantized weights";

// What each tensor of `infos` becomes under `options` (those marked in `keep_stored` — float8
// scales and quant-state tensors — as stored; a float8 weight of `scale_pairs` that converts:
// dequantized). Errors: InvalidArgument for a special dtype a tensor cannot be cast or decoded
// to; Unsupported for an LLM.int8 weight in a tile format that a dtype would dequantize.
Result<std::vector<Target>> Targets(const std::vector<TensorInfo>& infos,
                                    const PlanOptions& options,
                                    const std::map<size_t, ScalePair>& scale_pairs,
                                    const std::vector<bool>& keep_stored);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_TARGETS_H_
