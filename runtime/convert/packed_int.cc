#include "runtime/convert/packed_int.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/convert/dequant_element.h"
#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::convert {
namespace {

uint64_t WordsPerRow(const PackedIntState& s) { return (s.cols * s.bits + 31) / 32; }

// The eight 4-bit codes of a word, LSB first, one a byte.
uint64_t SpreadNibbles(uint32_t word) {
  uint64_t x = word;
  x = (x | x << 16) & 0x0000FFFF0000FFFFULL;
  x = (x | x << 8) & 0x00FF00FF00FF00FFULL;
  return (x | x << 4) & 0x0F0F0F0F0F0F0F0FULL;
}

#if defined(__x86_64__)
// out[i] = lut[code[i]] (codes below 16) sixteen at a time: the table's bytes as 2 or 4 SSSE3
// byte-shuffle tables, the looked-up bytes interleaved back into values. Returns how many it did
// (a multiple of 16).
template <typename Out>
__attribute__((target("ssse3"))) uint64_t LookupSsse3(const std::array<Out, 16>& lut,
                                                      const uint8_t* code, uint64_t n, Out* out) {
  constexpr size_t kPlanes = sizeof(Out);
  alignas(16) uint8_t planes[kPlanes][16];
  for (size_t k = 0; k < 16; ++k) {
    for (size_t b = 0; b < kPlanes; ++b) planes[b][k] = static_cast<uint8_t>(lut[k] >> (8 * b));
  }
  __m128i t[kPlanes];
  for (size_t b = 0; b < kPlanes; ++b) {
    t[b] = _mm_load_si128(reinterpret_cast<const __m128i*>(planes[b]));
  }
  auto store = [](Out* at, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(at), v); };
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(code + i));
    const __m128i b0 = _mm_shuffle_epi8(t[0], c), b1 = _mm_shuffle_epi8(t[1], c);
    if constexpr (kPlanes == 2) {
      store(out + i, _mm_unpacklo_epi8(b0, b1));
      store(out + i + 8, _mm_unpackhi_epi8(b0, b1));
    } else {
      const __m128i b2 = _mm_shuffle_epi8(t[2], c), b3 = _mm_shuffle_epi8(t[3], c);
      const __m128i lo01 = _mm_unpacklo_epi8(b0, b1), hi01 = _mm_unpackhi_epi8(b0, b1);
      const __m128i lo23 = _mm_unpacklo_epi8(b2, b3), hi23 = _mm_unpackhi_epi8(b2, b3);
      store(out + i, _mm_unpacklo_epi16(lo01, lo23));
      store(out + i + 4, _mm_unpackhi_epi16(lo01, lo23));
      store(out + i + 8, _mm_unpacklo_epi16(hi01, hi23));
      store(out + i + 12, _mm_unpackhi_epi16(hi01, hi23));
    }
  }
  return i;
}
const bool kSsse3 = __builtin_cpu_supports("ssse3");
#endif

// out[i] = lut[code[i]] for n codes.
template <typename Out>
void Lookup(const std::array<Out, 16>& lut, const uint8_t* code, uint64_t n, Out* out) {
  uint64_t i = 0;
#if defined(__x86_64__)
  if (kSsse3) i = LookupSsse3(lut, code, n, out);
#endif
  for (; i < n; ++i) out[i] = lut[code[i]];
}

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
  std::array<Out, 16> lut{};  // all 16 set: the SSSE3 lookup reads the whole table
  for (uint64_t c = c_begin; c < c_end;) {
    const uint64_t g = c / s.group_size;
    const uint64_t run_end = std::min(c_end, (g + 1) * s.group_size);
    const Group at = group(g);
    for (uint32_t u = 0; u < (1u << s.bits); ++u) lut[u] = value(at, static_cast<int32_t>(u));
    const uint8_t* run = code + (c - c_begin);
    Lookup(lut, run, run_end - c, out);
    out += run_end - c;
    c = run_end;
  }
}

// Columns a band of Decode gathers at once.
constexpr uint64_t kBandCols = 1024;

// The codes of rows [rb, rb_end) x columns [c0, c1) gathered into `band`, one a byte, row r's
// from band[(r - rb) * kBandCols] on (one row for kRows: rb's), reading their words in the
// order they lie.
template <PackOrder kOrder>
void GatherBand(const PackedIntState& s, const PackedCodes& codes, uint64_t rb, uint64_t rb_end,
                uint64_t c0, uint64_t c1, uint8_t* band) {
  if constexpr (kOrder == PackOrder::kRows) {
    uint64_t c = c0;
    if (s.bits == 4) {  // whole words: eight codes at once
      for (; c % 8 != 0 && c < c1; ++c) {
        band[c - c0] = static_cast<uint8_t>(codes.At<kOrder>(rb, c));
      }
      for (; c + 8 <= c1; c += 8) {
        const uint64_t eight = SpreadNibbles(codes.Word(rb * codes.row_words + c / 8));
        std::memcpy(band + (c - c0), &eight, 8);
      }
    }
    for (; c < c1; ++c) band[c - c0] = static_cast<uint8_t>(codes.At<kOrder>(rb, c));
  } else if (kOrder == PackOrder::kGptq && s.bits == 4 && c0 % 8 == 0 && c1 % 8 == 0) {
    for (uint64_t c = c0; c < c1; c += 8) {  // word (c / 8, r): row r's codes c .. c + 7
      for (uint64_t r = rb; r < rb_end; ++r) {
        const uint64_t eight = SpreadNibbles(codes.Word(c / 8 * s.rows + r));
        std::memcpy(band + (r - rb) * kBandCols + (c - c0), &eight, 8);
      }
    }
  } else if (kOrder == PackOrder::kAwq) {  // word (c, r / 8): column c of rows r .. r + 7
    for (uint64_t c = c0; c < c1; ++c) {
      for (uint64_t r = rb; r < rb_end; r += 8) {
        const uint64_t eight = SpreadNibbles(codes.Word(c * (s.rows / 8) + r / 8));
        for (uint64_t k = 0; k < 8 && r + k < rb_end; ++k) {  // row r + k: nibble [0,4,1,5,..][k]
          band[(r + k - rb) * kBandCols + (c - c0)] =
              static_cast<uint8_t>(eight >> (8 * ((k >> 1) | ((k & 1) << 2))));
        }
      }
    }
  } else {
    for (uint64_t c = c0; c < c1; ++c) {
      for (uint64_t r = rb; r < rb_end; ++r) {
        band[(r - rb) * kBandCols + (c - c0)] = static_cast<uint8_t>(codes.At<kOrder>(r, c));
      }
    }
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
  constexpr uint64_t kBandRows = kOrder == PackOrder::kRows ? 1 : 32;
  std::array<uint8_t, kBandRows * kBandCols> band;
  std::array<Out, kBandCols> decoded;
  const uint64_t end = first + count;
  const uint64_t r_first = first / s.cols, r_last = (end - 1) / s.cols;
  // Transposed bands start on a multiple of 8 rows (AWQ's words hold 8 rows): rows before
  // r_first are gathered, not decoded.
  const uint64_t r_start = kBandRows == 1 ? r_first : r_first - r_first % 8;
  for (uint64_t rb = r_start; rb <= r_last; rb += kBandRows) {
    const uint64_t rb_end = std::min(r_last + 1, rb + kBandRows);
    // The columns any row of the band wants (one row: its own).
    const uint64_t want_lo = rb == r_first ? first - rb * s.cols : 0;
    const uint64_t want_hi = rb_end - 1 == r_last ? end - r_last * s.cols : s.cols;
    const uint64_t c_from = kBandRows == 1 ? want_lo : 0;
    const uint64_t c_to = kBandRows == 1 ? want_hi : s.cols;
    for (uint64_t c0 = c_from; c0 < c_to; c0 += kBandCols) {
      const uint64_t c1 = std::min(c_to, c0 + kBandCols);
      GatherBand<kOrder>(s, codes, rb, rb_end, c0, c1, band.data());
      for (uint64_t r = std::max(rb, r_first); r < rb_end; ++r) {
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
