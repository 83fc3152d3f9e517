// Packed-integer dequantization on the CPU (specs/quant.md): compressed-tensors pack-quantized,
// GPTQ and AWQ weights (PackedIntState, its PackOrder saying where code (r, c) sits).
// W[r][c] = (q - zero[r][g]) * scale[g] with g = g_idx[c] (or c / group size), computed as the
// producers do in the scale's dtype: q - zero is exact there, the product rounded once into that
// dtype (here: an exact f32 product for bf16/f16 scales, then rounded); then encoded into the
// target (f32, bf16, f16) with CastBuffer's rounding. Bit-exact against compressed_tensors'
// dequantize(), AutoGPTQ's and AutoAWQ's CPU decode and torch's cast of them
// (tests/fixtures/make_ct_fixtures.py, make_gptq_fixtures.py).
//
// The reference the workers run for a tensor planned Conversion::kDequantPackedInt. Pure:
// thread-safe, no allocation.
#ifndef LOADSTONE_RUNTIME_CONVERT_PACKED_INT_H_
#define LOADSTONE_RUNTIME_CONVERT_PACKED_INT_H_

#include <cstddef>
#include <cstdint>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::convert {

// Decodes elements [first, first + count) (row-major over [rows, cols]) of the pack-quantized
// weight `state` into `count` elements of `to` at `dst`. `words`: the weight's int32 words from
// word `first_word` on (those elements' words are there; all of them, first_word 0, for a
// transposed() order); `scales`: the whole scale tensor.
// Errors: InvalidArgument when `to` is not f32, f16 or bf16, or the range is not inside the
// weight or starts before `first_word`; nothing written.
Status DequantPackedInt(const PackedIntState& state, DType to, const std::byte* words,
                        uint64_t first_word, uint64_t first, uint64_t count,
                        const std::byte* scales, std::byte* dst);

// The word holding element `e`, and the elements [first, end) that words [w0, w1) hold (for a
// transposed() order: 0, and all elements for all words, none for fewer).
uint64_t WordOf(const PackedIntState& state, uint64_t e);
void ElementsOfWords(const PackedIntState& state, uint64_t w0, uint64_t w1, uint64_t* first,
                     uint64_t* end);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_PACKED_INT_H_
