// GGUF block dequantization on the CPU (specs/quant.md, "GGUF blocks"): Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, as ggml's dequantize_row_* and the gguf package's
// gguf.quants define them. Each value is computed in f32 in the producers' order — the multiply
// and the add rounded separately, never fused (this file is built with -ffp-contract=off) — and
// encoded into the target (f32, bf16, f16) with CastBuffer's rounding: bit-exact against
// gguf.quants.dequantize for f32, and against PyTorch's cast of that for bf16 and f16
// (tests/runtime/convert/gguf_blocks_test.cc, on blocks written and decoded by the gguf package).
//
// This is the reference the workers run for a packed tensor planned Conversion::kDequantBlocks,
// and the one a device kernel is tested against. Pure: thread-safe, no allocation.
#ifndef LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCKS_H_
#define LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loadstone/dtype.h"
#include "loadstone/status.h"
#include "runtime/convert/gguf_block_decode.h"

namespace loadstone::convert {

// A block type this file dequantizes: its ggml name, elements and bytes per block, and its
// decoder (gguf_block_decode.h, shared with the CUDA kernels).
struct GgufBlockType {
  std::string_view name;
  uint32_t block_elems = 0;
  uint32_t block_bytes = 0;
  gguf::GgufType id = gguf::GgufType::kQ4_0;
};

// The type named `scheme` (PackedLayout::scheme: "Q4_K", ...), or nullptr when it is not one of
// the ten above (the IQ and ternary types stay packed).
const GgufBlockType* FindGgufBlockType(std::string_view scheme);

// True when DequantGgufBlocks(scheme, to, ...) converts: a type above and to = f32, bf16 or f16.
bool CanDequantGguf(std::string_view scheme, DType to);

// Decodes `blocks` whole blocks of `scheme` at `src` into blocks × block_elems elements of `to`
// at `dst`. REQUIRES: src holds blocks × block_bytes bytes, dst the output; no overlap; any
// alignment. InvalidArgument, naming the scheme and dtype, when !CanDequantGguf; nothing written.
Status DequantGgufBlocks(std::string_view scheme, DType to, const std::byte* src, std::byte* dst,
                         uint64_t blocks);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCKS_H_
