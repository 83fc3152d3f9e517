// One element of a quantized weight, decoded: the per-element rules that the CPU decoders
// (packed_int.cc, bitsandbytes.cc) and the CUDA kernels (cuda/dequant_kernels.cu) share, so
// that both run one definition of each producer's formula (specs/quant.md). constexpr, so
// that nvcc compiles them for the device (--expt-relaxed-constexpr); plain byte loads, so that
// any alignment works; each float operation on its own (no fused multiply-add: the CPU side is
// built with -ffp-contract=off, the device side with -fmad=false).
#ifndef LOADSTONE_RUNTIME_CONVERT_DEQUANT_ELEMENT_H_
#define LOADSTONE_RUNTIME_CONVERT_DEQUANT_ELEMENT_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "runtime/convert/float_bits.h"

namespace loadstone::convert {

// The little-endian 32-bit word at `p`.
constexpr uint32_t LoadWord(const std::byte* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// ---- Packed integers (PackedIntState: compressed-tensors, GPTQ, AWQ) ----

// Where code (r, c) of a packed-integer weight sits. `words` holds its words from word
// `first_word` on; row_words = ceil(cols * bits / 32) (kRows); word_shift = log2(32 / bits)
// (kRows, whose widths are powers of two).
struct PackedCodes {
  const std::byte* words;
  uint64_t first_word, rows, row_words;
  uint32_t bits;
  unsigned word_shift;

  constexpr uint32_t Word(uint64_t w) const { return LoadWord(words + 4 * (w - first_word)); }

  template <PackOrder kOrder>
  constexpr uint32_t At(uint64_t r, uint64_t c) const {
    const uint32_t mask = (1u << bits) - 1;
    if constexpr (kOrder == PackOrder::kRows) {  // along the row, no straddling
      const uint64_t in_word = c & ((uint64_t{1} << word_shift) - 1);
      return (Word(r * row_words + (c >> word_shift)) >> (bits * in_word)) & mask;
    } else if constexpr (kOrder == PackOrder::kGptq) {  // column r: one LSB-first bit stream
      const uint64_t bit = c * bits;
      const unsigned shift = bit % 32;
      uint32_t v = Word(bit / 32 * rows + r) >> shift;
      if (shift + bits > 32) v |= Word((bit / 32 + 1) * rows + r) << (32 - shift);
      return v & mask;
    } else {  // kAwq: 4-bit, output 8w + k in nibble [0, 4, 1, 5, 2, 6, 3, 7][k] of word w
      const unsigned k = r % 8;
      const unsigned nibble = (k >> 1) | ((k & 1) << 2);
      return (Word(c * (rows / 8) + r / 8) >> (4 * nibble)) & mask;
    }
  }
};

// (q - zero) * scale as the producers compute it in the scale's dtype: the difference is exact,
// the product rounded once into that dtype; as f32 bits.
constexpr uint32_t PackedIntValueBits(int32_t diff, uint32_t scale_bits, DType scale_dtype) {
  const uint32_t p =
      std::bit_cast<uint32_t>(static_cast<float>(diff) * std::bit_cast<float>(scale_bits));
  return scale_dtype == DType::kBF16  ? BF16ToF32Bits(F32ToBF16Bits(p))
         : scale_dtype == DType::kF16 ? F16ToF32Bits(F32ToF16Bits(p))
                                      : p;
}

// ---- bitsandbytes ----

// Nibble `k` of a 4-bit block whose absmax is `absmax`: code[k] * absmax (NF4); FP4 takes the
// magnitude of codes 0-7 and the sign from bit 3 (code 8 is -0.0), as bitsandbytes' kernels.
constexpr float Bnb4Value(bool fp4, const float* code, unsigned k, float absmax) {
  if (!fp4) return code[k] * absmax;
  const float magnitude = code[k & 7] * absmax;
  return (k & 8) ? -magnitude : magnitude;
}

// A nested absmax: nested_code[u8] * nested_absmax[block / nested_blocksize], then + offset,
// each rounded on its own.
constexpr float Bnb4NestedAbsmax(const float* nested_code, const float* nested_absmax,
                                 uint32_t nested_blocksize, float offset, uint8_t code,
                                 uint64_t block) {
  const float scaled = nested_code[code] * nested_absmax[block / nested_blocksize];
  return scaled + offset;
}

// bitsandbytes multiplies by 7.874015718698502e-3, which torch rounds to the f32 nearest 1/127.
inline constexpr float kInv127 = static_cast<float>(7.874015718698502e-3);

// An LLM.int8 value: (float(q) * SCB[row]) * float32(1/127), two roundings.
constexpr float BnbInt8Value(int8_t q, float scb) {
  return (static_cast<float>(q) * scb) * kInv127;
}

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_DEQUANT_ELEMENT_H_
