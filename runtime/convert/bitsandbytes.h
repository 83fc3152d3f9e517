// bitsandbytes dequantization on the CPU (specs/quant.md, "bitsandbytes 4-bit" and "8-bit").
//
// 4-bit (NF4, FP4), as bitsandbytes' CUDA kernels decode: the nibble's code value times its block's
// absmax, one f32 multiply; FP4 takes the magnitude of codes 0-7 and the sign from bit 3 (code 8 is
// -0.0). A nested absmax is nested_code[u8] * nested_absmax[block / nested_blocksize], then +
// offset, each rounded on its own (this file is built with -ffp-contract=off). The f32 result is
// encoded into the target (f32, bf16, f16) with CastBuffer's rounding: bit-exact against the
// fixture's reference (tests/fixtures/make_bnb_fixtures.py) and torch's cast of it.
//
// LLM.int8 ("row" format): W[r][c] = (float(q[r][c]) * SCB[r]) * float32(1/127), two roundings,
// as bitsandbytes' int8_vectorwise_dequant multiplies by the f32 reciprocal (dividing by 127
// differs by an ulp in ~5-8% of the values); then encoded as above.
//
// These are the references the workers run for tensors planned Conversion::kDequantBnb4 and
// kDequantBnb8. Pure: thread-safe, no allocation.
#ifndef LOADSTONE_RUNTIME_CONVERT_BITSANDBYTES_H_
#define LOADSTONE_RUNTIME_CONVERT_BITSANDBYTES_H_

#include <cstddef>
#include <cstdint>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::convert {

// True when DequantBnb4 decodes into `to`: f32, f16 or bf16.
bool CanDequantBnb4(DType to);

// Decodes elements [first, first + count) of the bitsandbytes 4-bit weight laid out by `layout`
// (PackedLayout::bnb4 set) into `count` elements of `to` at `dst`. `packed`: the byte holding
// element `first` (byte first / 2 of the weight; an odd `first` starts at its low nibble).
// `absmax`: the weight's whole absmax tensor (f32, or u8 codes when nested). REQUIRES: those
// bytes exist. Errors: InvalidArgument when !CanDequantBnb4(to), the layout is not bitsandbytes'
// or [first, first + count) is not inside the weight; nothing written.
Status DequantBnb4(const PackedLayout& layout, DType to, const std::byte* packed, uint64_t first,
                   uint64_t count, const std::byte* absmax, std::byte* dst);

// Decodes elements [first, first + count) (row-major) of an LLM.int8 weight of `cols` columns
// from `codes` (the int8 codes of those elements) with the row absmax `scb` (f32, the whole
// tensor) into `count` elements of `to` at `dst`. Errors: InvalidArgument when
// !CanDequantBnb4(to) (the same targets) or cols is 0; nothing written.
Status DequantBnbInt8(DType to, const std::byte* codes, uint64_t first, uint64_t count,
                      uint64_t cols, const std::byte* scb, std::byte* dst);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_BITSANDBYTES_H_
