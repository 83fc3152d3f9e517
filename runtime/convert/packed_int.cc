#include "runtime/convert/packed_int.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::convert {
namespace {

uint64_t WordsPerRow(const PackedIntState& s) { return (s.cols * s.bits + 31) / 32; }

// (q - zero) * scale rounded to the scale's dtype, as f32 bits.
uint32_t Decoded(int32_t diff, uint32_t scale_bits, DType scale_dtype) {
  const uint32_t p =
      std::bit_cast<uint32_t>(static_cast<float>(diff) * std::bit_cast<float>(scale_bits));
  return scale_dtype == DType::kBF16  ? BF16ToF32Bits(F32ToBF16Bits(p))
         : scale_dtype == DType::kF16 ? F16ToF32Bits(F32ToF16Bits(p))
                                      : p;
}

// The code of element (r, c) in the words of a PackOrder (first_word: the index of words[0]).
template <PackOrder kOrder>
class Codes {
 public:
  Codes(const PackedIntState& s, const std::byte* words, uint64_t first_word)
      : words_(words), first_word_(first_word), rows_(s.rows), row_words_(WordsPerRow(s)),
        bits_(s.bits), mask_((1u << s.bits) - 1),
        word_shift_(static_cast<unsigned>(std::countr_zero(32 / s.bits))) {}

  uint32_t At(uint64_t r, uint64_t c) const {
    if constexpr (kOrder == PackOrder::kRows) {  // power-of-two widths: no straddling
      const uint64_t in_word = c & ((uint64_t{1} << word_shift_) - 1);
      return (Word(r * row_words_ + (c >> word_shift_)) >> (bits_ * in_word)) & mask_;
    } else if constexpr (kOrder == PackOrder::kGptq) {  // column r is one LSB-first bit stream
      const uint64_t bit = c * bits_;
      const unsigned shift = bit % 32;
      const uint64_t row = bit / 32;
      uint32_t v = Word(row * rows_ + r) >> shift;
      if (shift + bits_ > 32) v |= Word((row + 1) * rows_ + r) << (32 - shift);
      return v & mask_;
    } else {  // kAwq: 4-bit, outputs interleaved in the word
      static constexpr unsigned kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
      return (Word(c * (rows_ / 8) + r / 8) >> (4 * kNibble[r % 8])) & mask_;
    }
  }

 private:
  uint32_t Word(uint64_t w) const {
    uint32_t word;
    std::memcpy(&word, words_ + 4 * (w - first_word_), 4);
    return word;
  }

  const std::byte* words_;
  uint64_t first_word_, rows_, row_words_;
  uint32_t bits_, mask_;
  unsigned word_shift_;  // log2 of the codes a word (kRows)
};

// Row by row; a group's scale and zero are looked up once, and without g_idx its 2- to 4-bit
// outputs are computed once into a table.
template <PackOrder kOrder, typename Out, Out (*Encode)(uint32_t)>
void Decode(const PackedIntState& s, const std::byte* words, uint64_t first_word, uint64_t first,
            uint64_t count, const std::byte* scales, std::byte* dst) {
  const Codes<kOrder> codes(s, words, first_word);
  const uint32_t mask = (1u << s.bits) - 1;
  const auto symmetric_zero = static_cast<int16_t>(1 << (s.bits - 1));
  const uint64_t scale_bytes = DTypeBits(s.scale_dtype) / 8;
  const bool table = s.g_idx.empty() && s.bits <= 4;
  std::byte* out = dst;
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t r = e / s.cols;
    const uint64_t c_begin = e - r * s.cols;
    const uint64_t c_end = std::min(s.cols, c_begin + (end - e));
    uint64_t group = UINT64_MAX, group_end = 0;
    uint32_t scale_bits = 0;
    int32_t zero = 0;
    std::array<Out, 16> lut{};
    auto use_group = [&](uint64_t g) {
      group = g;
      const uint64_t at = kOrder == PackOrder::kRows ? r * s.groups + g : g * s.rows + r;
      uint32_t raw = 0;
      std::memcpy(&raw, scales + at * scale_bytes, scale_bytes);
      scale_bits = Fp8ScaleToF32Bits(raw, s.scale_dtype);
      zero = s.zeros.empty() ? symmetric_zero : s.zeros[r * s.groups + g];
      if (table) {
        for (uint32_t u = 0; u <= mask; ++u) {
          lut[u] = Encode(Decoded(static_cast<int32_t>(u) - zero, scale_bits, s.scale_dtype));
        }
      }
    };
    for (uint64_t c = c_begin; c < c_end; ++c) {
      if (!s.g_idx.empty()) {
        const auto g = static_cast<uint64_t>(s.g_idx[c]);
        if (g != group) use_group(g);
      } else if (c >= group_end) {
        use_group(c / s.group_size);
        group_end = (group + 1) * s.group_size;
      }
      const uint32_t u = codes.At(r, c);
      const Out v = table ? lut[u]
                          : Encode(Decoded(static_cast<int32_t>(u) - zero, scale_bits,
                                           s.scale_dtype));
      std::memcpy(out, &v, sizeof(Out));
      out += sizeof(Out);
    }
    e += c_end - c_begin;
  }
}

template <typename Out, Out (*Encode)(uint32_t)>
void DecodeAny(const PackedIntState& s, const std::byte* words, uint64_t first_word,
               uint64_t first, uint64_t count, const std::byte* scales, std::byte* dst) {
  switch (s.order) {
    case PackOrder::kRows:
      return Decode<PackOrder::kRows, Out, Encode>(s, words, first_word, first, count, scales,
                                                   dst);
    case PackOrder::kGptq:
      return Decode<PackOrder::kGptq, Out, Encode>(s, words, first_word, first, count, scales,
                                                   dst);
    case PackOrder::kAwq:
      return Decode<PackOrder::kAwq, Out, Encode>(s, words, first_word, first, count, scales, dst);
  }
}

constexpr uint32_t Identity(uint32_t f) { return f; }

}  // namespace

uint64_t WordOf(const PackedIntState& s, uint64_t e) {
  if (s.transposed()) return 0;  // read whole
  return e / s.cols * WordsPerRow(s) + e % s.cols / (32 / s.bits);
}

void ElementsOfWords(const PackedIntState& s, uint64_t w0, uint64_t w1, uint64_t* first,
                     uint64_t* end) {
  if (s.transposed()) {  // only the whole tensor decodes
    const uint64_t n = s.rows * s.cols;
    *first = w0 == 0 ? 0 : n;
    *end = w1 >= s.words() ? n : 0;
    return;
  }
  const uint64_t per_word = 32 / s.bits, row_words = WordsPerRow(s);
  auto start_of = [&](uint64_t w) {  // the first element of word w (or the row's end)
    return w / row_words * s.cols + std::min(s.cols, w % row_words * per_word);
  };
  *first = start_of(w0);
  *end =
      w1 == 0 ? 0 : start_of(w1 - 1) + std::min(per_word, s.cols - (w1 - 1) % row_words * per_word);
}

Status DequantPackedInt(const PackedIntState& state, DType to, const std::byte* words,
                        uint64_t first_word, uint64_t first, uint64_t count,
                        const std::byte* scales, std::byte* dst) {
  const uint64_t elements = state.rows * state.cols;
  if (first > elements || count > elements - first ||
      (count > 0 && WordOf(state, first) < first_word)) {
    return Status::InvalidArgument(
        fmt::format("elements [{}, {}) of a pack-quantized weight of {} from word {}", first,
                    first + count, elements, first_word));
  }
  switch (to) {
    case DType::kF32:
      DecodeAny<uint32_t, Identity>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    case DType::kF16:
      DecodeAny<uint16_t, F32ToF16Bits>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    case DType::kBF16:
      DecodeAny<uint16_t, F32ToBF16Bits>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    default:
      return Status::InvalidArgument(fmt::format(
          "cannot dequantize a pack-quantized weight into {}: float32, float16 or bfloat16 only",
          TorchName(to)));
  }
}

}  // namespace loadstone::convert
