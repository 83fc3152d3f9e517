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

// One division per row and per group, shifts within a word: the code widths are powers of two.
template <typename Out, Out (*Encode)(uint32_t)>
void Decode(const PackedIntState& s, const std::byte* words, uint64_t first_word, uint64_t first,
            uint64_t count, const std::byte* scales, std::byte* dst) {
  const uint64_t per_word = 32 / s.bits, row_words = WordsPerRow(s);
  const unsigned word_shift = static_cast<unsigned>(std::countr_zero(per_word));
  const uint32_t mask = (1u << s.bits) - 1;
  const int32_t offset = 1 << (s.bits - 1);
  const uint64_t scale_bytes = DTypeBits(s.scale_dtype) / 8;
  std::byte* out = dst;
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t r = e / s.cols;
    const uint64_t c_begin = e - r * s.cols;
    const uint64_t c_end = std::min(s.cols, c_begin + (end - e));
    // Word index of column c: base + (c >> word_shift), never negative (the sum is taken in
    // unsigned arithmetic, so a piece that starts mid-row wraps base and the sum back).
    const uint64_t base = r * row_words - first_word;
    uint64_t group = UINT64_MAX, group_end = 0;
    uint32_t scale_bits = 0;
    int32_t zero = 0;
    std::array<Out, 16> lut{};  // 2- and 4-bit codes: every output of the group, computed once
    auto use_group = [&](uint64_t g) {
      group = g;
      uint32_t raw = 0;
      std::memcpy(&raw, scales + (r * s.groups + g) * scale_bytes, scale_bytes);
      scale_bits = Fp8ScaleToF32Bits(raw, s.scale_dtype);
      zero = s.zero_point.empty() ? 0 : s.zero_point[r * s.groups + g];
      if (s.bits <= 4) {
        for (uint32_t u = 0; u <= mask; ++u) {
          lut[u] =
              Encode(Decoded(static_cast<int32_t>(u) - offset - zero, scale_bits, s.scale_dtype));
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
      uint32_t word;
      std::memcpy(&word, words + 4 * (base + (c >> word_shift)), 4);
      const uint32_t u = (word >> (s.bits * (c & (per_word - 1)))) & mask;
      const Out v =
          s.bits <= 4
              ? lut[u]
              : Encode(Decoded(static_cast<int32_t>(u) - offset - zero, scale_bits, s.scale_dtype));
      std::memcpy(out, &v, sizeof(Out));
      out += sizeof(Out);
    }
    e += c_end - c_begin;
  }
}

constexpr uint32_t Identity(uint32_t f) { return f; }

}  // namespace

uint64_t WordOf(const PackedIntState& s, uint64_t e) {
  return e / s.cols * WordsPerRow(s) + e % s.cols / (32 / s.bits);
}

void ElementsOfWords(const PackedIntState& s, uint64_t w0, uint64_t w1, uint64_t* first,
                     uint64_t* end) {
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
      Decode<uint32_t, Identity>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    case DType::kF16:
      Decode<uint16_t, F32ToF16Bits>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    case DType::kBF16:
      Decode<uint16_t, F32ToBF16Bits>(state, words, first_word, first, count, scales, dst);
      return Status::OK();
    default:
      return Status::InvalidArgument(fmt::format(
          "cannot dequantize a pack-quantized weight into {}: float32, float16 or bfloat16 only",
          TorchName(to)));
  }
}

}  // namespace loadstone::convert
