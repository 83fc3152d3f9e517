// Block-scaled FP8 dequantization (specs/quant.md, "FP8 weights"): a weight W of M x N float8
// codes stored row-major with one f32 scale per block of block_rows x block_cols elements,
//
//   W[i][j] = float(q[i][j]) * scale[i / block_rows][j / block_cols]      (f32 math)
//
// then encoded into the target dtype with the rounding of CastBuffer. DeepSeek-V3 stores the
// scale as `<name>_scale_inv` (multiplied despite the name) with 128 x 128 blocks and ragged
// edges: the scale has ceil(M / 128) x ceil(N / 128) entries. Per-tensor, per-channel and
// per-group scales are the same rule with block_rows = M or 1 and block_cols = N or the group.
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
// f32 values, row-major, little-endian (any alignment); scale_cols = ceil(cols / block_cols).
struct Fp8BlockScales {
  const std::byte* scales = nullptr;
  uint64_t cols = 0;        // N: elements in one row of the weight
  uint64_t block_rows = 0;  // rows that share a scale
  uint64_t block_cols = 0;  // columns that share a scale
  uint64_t scale_cols = 0;  // scales per row of blocks
};

// The f32 bits of float(code) * scale, for e4m3fn (`e5m2` false) or e5m2 codes. NaN codes
// give NaN; the product rounds to nearest even (the default environment).
constexpr uint32_t Fp8ScaledF32Bits(uint8_t code, bool e5m2, uint32_t scale_bits) {
  const uint32_t q = e5m2 ? F8E5M2ToF32Bits(code) : F8E4M3ToF32Bits(code);
  return std::bit_cast<uint32_t>(std::bit_cast<float>(q) * std::bit_cast<float>(scale_bits));
}

// True when DequantFp8Block converts: from f8_e4m3fn or f8_e5m2 to f32, f16 or bf16.
bool CanDequantFp8Block(DType from, DType to);

// Dequantizes `count` consecutive elements of the weight, starting at element `first` (row-major
// index into M x N), from `src` (the codes of those elements) into `dst` (count elements of
// `to`). Pure, thread-safe, no allocation.
// Errors: InvalidArgument when !CanDequantFp8Block(from, to) or the layout is empty (a zero
// cols, block size or scale_cols, or scale_cols != ceil(cols / block_cols)); nothing written.
Status DequantFp8Block(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t first,
                       uint64_t count, const Fp8BlockScales& layout);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_FP8_BLOCK_H_
