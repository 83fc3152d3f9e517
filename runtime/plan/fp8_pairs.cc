// Which float8 weights are dequantized with which scales (plan.h, PlanOptions::fp8_block), and
// which quantized weights with which quant state.
#include "runtime/plan/fp8_pairs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/convert/fp8_block.h"

namespace loadstone::planning {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool IsFloat8(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2; }

uint64_t CeilDiv(uint64_t n, uint64_t d) { return (n + d - 1) / d; }

// The block that one compressed-tensors scale covers along a dimension of `n` elements with
// `scales` scales: the whole dimension (one scale), the configured block when it fits (ragged
// edges included), else an exact division (channel: 1, group: n / groups). 0: none fits.
uint64_t InferBlock(uint64_t n, uint64_t scales, uint64_t configured) {
  if (scales == 1) return n;
  if (CeilDiv(n, configured) == scales) return configured;
  return scales != 0 && n % scales == 0 ? n / scales : 0;
}

// The scales' [rows, cols] as compressed-tensors stores them: [] / [1] / [1, 1] per tensor,
// [M, 1] per channel, [M, G] per group, [R, C] per block. nullopt for any other rank.
std::optional<std::array<uint64_t, 2>> ScaleGrid(const TensorInfo& scale) {
  const auto& s = scale.shape;
  if (s.empty() || (s.size() == 1 && s[0] == 1)) return std::array<uint64_t, 2>{1, 1};
  if (s.size() == 2) return std::array<uint64_t, 2>{s[0], s[1]};
  return std::nullopt;
}

}  // namespace

Result<std::map<size_t, ScalePair>> PairFp8Scales(const Checkpoint& checkpoint,
                                                  const PlanOptions& options,
                                                  std::array<uint64_t, 2> block) {
  std::map<size_t, ScalePair> pairs;
  // A weight becomes a floating-point tensor by the target dtype or by its own special dtype
  // (the LibTorch face casts every tensor that way): then it is dequantized, never cast bare.
  if (!options.dtype && options.special_dtypes.empty()) return pairs;
  const auto& infos = checkpoint.tensors();
  const auto [block_rows, block_cols] = block;
  if (block_rows == 0 || block_cols == 0) {
    return Status::InvalidArgument("the float8 block size must be positive in both dimensions");
  }
  for (size_t w = 0; w < infos.size(); ++w) {
    const TensorInfo& weight = infos[w];
    if (!IsFloat8(weight.dtype)) continue;
    if (!options.dtype && !options.special_dtypes.contains(weight.name)) continue;
    const TensorInfo* scale = checkpoint.Float8Scales(weight);
    if (scale == nullptr) continue;
    const bool deepseek = scale->name.ends_with("_scale_inv");
    ScalePair pair{static_cast<size_t>(scale - infos.data()), 0, 0};
    const auto grid = ScaleGrid(*scale);
    if (weight.shape.size() == 2 && grid) {
      if (deepseek) {
        const bool fits = scale->shape.size() == 2 && scale->dtype == DType::kF32 &&
                          (*grid)[0] == CeilDiv(weight.shape[0], block_rows) &&
                          (*grid)[1] == CeilDiv(weight.shape[1], block_cols);
        if (fits) pair = {pair.scale, block_rows, block_cols};
      } else if (convert::IsFp8ScaleDType(scale->dtype)) {
        pair.block_rows = InferBlock(weight.shape[0], (*grid)[0], block_rows);
        pair.block_cols = InferBlock(weight.shape[1], (*grid)[1], block_cols);
      }
    }
    if (pair.block_rows == 0 || pair.block_cols == 0) {
      const std::string expected =
          deepseek ? fmt::format("2-D f32 scales of ceil(rows / {}) x ceil(cols / {})", block_rows,
                                 block_cols)
                   : "f32, bf16 or f16 scales of [] or [1] (per tensor), [rows, 1] (per "
                     "channel), [rows, groups] (per group) or [ceil(rows / R), ceil(cols / C)] "
                     "(per block)";
      return Status::InvalidArgument(fmt::format(
          "float8 tensor '{}' {} {} has scales '{}' {} {} that do not fit its shape ({} "
          "expected; float8 blocks of {} x {}); give the checkpoint's quantization block size "
          "(--fp8-block ROWS,COLS), or load without --dtype to keep the float8 bytes as stored",
          weight.name, TorchName(weight.dtype), ShapeString(weight.shape), scale->name,
          TorchName(scale->dtype), ShapeString(scale->shape), expected, block_rows, block_cols));
    }
    pairs[w] = pair;
  }
  return pairs;
}

Status PairQuantStates(const Checkpoint& checkpoint, std::map<size_t, ScalePair>* pairs,
                       std::vector<bool>* keep_stored) {
  const auto& infos = checkpoint.tensors();
  for (size_t w = 0; w < infos.size(); ++w) {
    if (!infos[w].packed) continue;  // float8 weights pair by PairFp8Scales, with their blocks
    LOADSTONE_ASSIGN_OR_RETURN(const auto companions, checkpoint.Companions(infos[w]));
    if (companions.empty()) continue;
    for (const TensorInfo* c : companions) (*keep_stored)[static_cast<size_t>(c - infos.data())] = true;
    (*pairs)[w] = {static_cast<size_t>(companions.front() - infos.data()), 0, 0};
  }
  return Status::OK();
}

}  // namespace loadstone::planning
