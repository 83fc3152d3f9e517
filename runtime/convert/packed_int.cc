#include "runtime/convert/packed_int.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "runtime/convert/dequant_element.h"
#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::convert {
namespace {

uint64_t WordsPerRow(const PackedIntState& s) { return (s.cols * s.bits + 31) / 32; }

// Columns [c_begin, c_end) of row r into `out`, their codes at code[c_begin - c0] on. A group's
// scale and zero are looked up once, and without g_idx its 2- to 4-bit outputs are computed once
// into a table that the group's run of columns then indexes.
template <PackOrder kOrder, typename Out, Out (*Encode)(uint32_t)>
void DecodeRow(const PackedIntState& s, const std::byte* scales, uint64_t r, uint64_t c_begin,
               uint64_t c_end, const uint8_t* code, Out* out) {
  const uint64_t scale_bytes = DTypeBits(s.scale_dtype) / 8;
  struct Group {
    uint32_t scale_bits;
    int32_t zero;
  };
  auto group = [&](uint64_t g) {
    const uint64_t at = kOrder == PackOrder::kRows ? r * s.groups + g : g * s.rows + r;
    uint32_t raw = 0;
    std::memcpy(&raw, scales + at * scale_bytes, scale_bytes);
    return Group{Fp8ScaleToF32Bits(raw, s.scale_dtype),
                 s.zeros.empty() ? (1 << (s.bits - 1)) : s.zeros[r * s.groups + g]};
  };
  auto value = [&](const Group& g, int32_t u) {
    return Encode(PackedIntValueBits(u - g.zero, g.scale_bits, s.scale_dtype));
  };
  if (!s.g_idx.empty() || s.bits > 4) {  // element by element
    uint64_t last = UINT64_MAX;
    Group at{};
    for (uint64_t c = c_begin; c < c_end; ++c) {
      const uint64_t g = s.g_idx.empty() ? c / s.group_size : static_cast<uint64_t>(s.g_idx[c]);
      if (g != last) at = group(last = g);
      *out++ = value(at, code[c - c_begin]);
    }
    return;
  }
  std::array<Out, 16> lut;
  for (uint64_t c = c_begin; c < c_end;) {
    const uint64_t g = c / s.group_size;
    const uint64_t run_end = std::min(c_end, (g + 1) * s.group_size);
    const Group at = group(g);
    for (uint32_t u = 0; u < (1u << s.bits); ++u) lut[u] = value(at, static_cast<int32_t>(u));
    const uint8_t* run = code + (c - c_begin);
    for (uint64_t i = 0, n = run_end - c; i < n; ++i) out[i] = lut[run[i]];
    out += run_end - c;
    c = run_end;
  }
}

// Band by band: the codes of up to kBandRows rows x kBandCols columns gathered into bytes (in
// the order their words lie: along a row for kRows; GPTQ and AWQ keep a row's codes a word-row
// apart and neighbouring rows' words side by side, so column by column), then decoded row by
// row. Only the range's first and last rows are partial.
template <PackOrder kOrder, typename Out, Out (*Encode)(uint32_t)>
void Decode(const PackedIntState& s, const std::byte* words, uint64_t first_word, uint64_t first,
            uint64_t count, const std::byte* scales, std::byte* dst) {
  if (count == 0) return;
  const PackedCodes codes{words,  first_word, s.rows, WordsPerRow(s), s.bits,
                          static_cast<unsigned>(std::countr_zero(32 / s.bits))};
  constexpr uint64_t kBandRows = kOrder == PackOrder::kRows ? 1 : 32, kBandCols = 1024;
  std::array<uint8_t, kBandRows * kBandCols> band;
  std::array<Out, kBandCols> decoded;
  const uint64_t end = first + count;
  const uint64_t r_first = first / s.cols, r_last = (end - 1) / s.cols;
  for (uint64_t rb = r_first; rb <= r_last; rb += kBandRows) {
    const uint64_t rb_end = std::min(r_last + 1, rb + kBandRows);
    // The columns any row of the band wants (one row: its own).
    const uint64_t want_lo = rb == r_first ? first - rb * s.cols : 0;
    const uint64_t want_hi = rb_end - 1 == r_last ? end - r_last * s.cols : s.cols;
    const uint64_t c_from = kBandRows == 1 ? want_lo : 0;
    const uint64_t c_to = kBandRows == 1 ? want_hi : s.cols;
    for (uint64_t c0 = c_from; c0 < c_to; c0 += kBandCols) {
      const uint64_t c1 = std::min(c_to, c0 + kBandCols);
      if constexpr (kOrder == PackOrder::kRows) {
        for (uint64_t c = c0; c < c1; ++c) band[c - c0] = static_cast<uint8_t>(codes.At<kOrder>(rb, c));
      } else {
        for (uint64_t c = c0; c < c1; ++c) {
          for (uint64_t r = rb; r < rb_end; ++r) {
            band[(r - rb) * kBandCols + (c - c0)] = static_cast<uint8_t>(codes.At<kOrder>(r, c));
          }
        }
      }
      for (uint64_t r = rb; r < rb_end; ++r) {
        const uint64_t lo = std::max(c0, r == r_first ? first - r * s.cols : 0);
        const uint64_t hi = std::min(c1, r == r_last ? end - r * s.cols : s.cols);
        if (lo >= hi) continue;
        DecodeRow<kOrder, Out, Encode>(s, scales, r, lo, hi,
                                       band.data() + (r - rb) * kBandCols + (lo - c0),
                                       decoded.data());
        std::memcpy(dst + (r * s.cols + lo - first) * sizeof(Out), decoded.data(),
                    (hi - lo) * sizeof(Out));
      }
    }
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
