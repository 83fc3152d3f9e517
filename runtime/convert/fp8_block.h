// Block-scaled FP8 dequantization (specs/quant.md, "FP8 weights"): a weight W of M x N float8
// codes stored row-major with one scale per block of block_rows x block_cols elements,
//
//   W[i][j] = float(q[i][j]) * scale[i / block_rows][j / block_cols]
//
// computed in f32 and rounded to the scale's dtype (f32, bf16 or f16) — what PyTorch gives for
// compressed-tensors' `x_q.to(scale.dtype) * scale` — then encoded into the target dtype with the
// rounding of CastBuffer. DeepSeek-V3 stores f32 scales as `<name>_scale_inv` (multiplied
// despite the name) with 128 x 128 blocks and ragged edges: ceil(M / 128) x ceil(N / 128)
// scales. compressed-tensors' `<name>_scale` per tensor, channel, group or block is the same
// rule with block_rows = M or 1 and block_cols = N, the group or the block.
//
// The scalar contract (Fp8ScaledF32Bits) is what the CPU loop here and the CUDA kernel
// (cuda/cast_kernels.cu) both apply, so that the GPU result is bit-exact with the CPU reference.
#ifndef LOADSTONE_RUNTIME_CONVERT_FP8_BLOCK_H_
#define LOADSTONE_RUNTIME_CONVERT_FP8_BLOCK_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "loadstone/dtype.h"
#include "loadstone/status.h"
#include "runtime/convert/float_bits.h"

namespace loadstone::convert {

// Where the scales are and how they cover the weight. `scales` holds scale_rows x scale_cols
// values of `scale_dtype`, row-major, little-endian (any alignment); scale_cols =
// ceil(cols / block_cols).
struct Fp8BlockScales {
  const std::byte* scales = nullptr;
  uint64_t cols = 0;        // N: elements in one row of the weight
  uint64_t block_rows = 0;  // rows that share a scale
  uint64_t block_cols = 0;  // columns that share a scale
  uint64_t scale_cols = 0;  // scales per row of blocks
  DType scale_dtype = DType::kF32;  // f32, bf16 or f16 (IsFp8ScaleDType)
};

constexpr bool IsFp8ScaleDType(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// A stored scale (its dtype's bits in the low bytes of `raw`) as f32 bits: bf16 and f16 widen
// exactly.
constexpr uint32_t Fp8ScaleToF32Bits(uint32_t raw, DType scale_dtype) {
  return scale_dtype == DType::kBF16  ? BF16ToF32Bits(static_cast<uint16_t>(raw))
         : scale_dtype == DType::kF16 ? F16ToF32Bits(static_cast<uint16_t>(raw))
                                      : raw;
}

// The f32 bits of float(code) * scale (`scale_bits`: the scale as f32 bits) for e4m3fn (`e5m2`
// false) or e5m2 codes, rounded to nearest even in f32 and then, for a bf16 or f16 scale, to
// that dtype (exact in f32: 4 x 11 significant bits; PyTorch's product of two such tensors
// rounds once). NaN codes give NaN.
constexpr uint32_t Fp8ScaledF32Bits(uint8_t code, bool e5m2, uint32_t scale_bits,
                                    DType scale_dtype) {
  const uint32_t q = e5m2 ? F8E5M2ToF32Bits(code) : F8E4M3ToF32Bits(code);
  const uint32_t p =
      std::bit_cast<uint32_t>(std::bit_cast<float>(q) * std::bit_cast<float>(scale_bits));
  return scale_dtype == DType::kBF16  ? BF16ToF32Bits(F32ToBF16Bits(p))
         : scale_dtype == DType::kF16 ? F16ToF32Bits(F32ToF16Bits(p))
                                      : p;
}

// True when DequantFp8Block converts: from f8_e4m3fn or f8_e5m2 to f32, f16 or bf16.
bool CanDequantFp8Block(DType from, DType to);

// Dequantizes `count` consecutive elements of the weight, starting at element `first` (row-major
// index into M x N), from `src` (the codes of those elements) into `dst` (count elements of
// `to`). Pure, thread-safe, no allocation.
// Errors: InvalidArgument when !CanDequantFp8Block(from, to), the scale dtype is not f32, bf16
// or f16, or the layout is empty (a zero cols, block size or scale_cols, or scale_cols !=
// ceil(cols / block_cols)); nothing written.
Status DequantFp8Block(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t first,
                       uint64_t count, const Fp8BlockScales& layout);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_FP8_BLOCK_H_
