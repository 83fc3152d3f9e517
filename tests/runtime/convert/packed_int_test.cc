// DequantPackedInt's machinery — codes gathered band by band (eight 4-bit codes a word), the
// 16-entry tables looked up sixteen at a time, bands aligned to AWQ's eight rows, ranges that
// start and end mid-row — against the per-element definition it is built from
// (dequant_element.h: PackedCodes::At and PackedIntValueBits, which the producers' fixtures pin
// bit for bit, tests/runtime/pipeline/gptq_test.cc and pack_quantized_test.cc): every order and
// width, with and without zero points and g_idx, into f32, bf16 and f16, on shapes that are not
// multiples of the band.
#include "runtime/convert/packed_int.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/convert/dequant_element.h"
#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::convert {
namespace {

// Element (r, c) by the definition, encoded into `to`.
std::vector<std::byte> Reference(const PackedIntState& s, DType to,
                                 const std::vector<std::byte>& words,
                                 const std::vector<std::byte>& scales) {
  const PackedCodes codes{words.data(), 0,
                          s.rows,       (s.cols * s.bits + 31) / 32,
                          s.bits,       static_cast<unsigned>(std::countr_zero(32 / s.bits))};
  const uint64_t out = DTypeBits(to) / 8, scale_bytes = DTypeBits(s.scale_dtype) / 8;
  std::vector<std::byte> y(s.rows * s.cols * out);
  for (uint64_t r = 0; r < s.rows; ++r) {
    for (uint64_t c = 0; c < s.cols; ++c) {
      const uint64_t g = s.g_idx.empty() ? c / s.group_size : static_cast<uint64_t>(s.g_idx[c]);
      const uint64_t at = s.order == PackOrder::kRows ? r * s.groups + g : g * s.rows + r;
      uint32_t raw = 0;
      std::memcpy(&raw, scales.data() + at * scale_bytes, scale_bytes);
      const int32_t zero = s.zeros.empty() ? 1 << (s.bits - 1) : s.zeros[r * s.groups + g];
      const uint32_t code = s.order == PackOrder::kRows   ? codes.At<PackOrder::kRows>(r, c)
                            : s.order == PackOrder::kGptq ? codes.At<PackOrder::kGptq>(r, c)
                                                          : codes.At<PackOrder::kAwq>(r, c);
      const uint32_t f = PackedIntValueBits(static_cast<int32_t>(code) - zero,
                                            Fp8ScaleToF32Bits(raw, s.scale_dtype), s.scale_dtype);
      std::byte* dst = y.data() + (r * s.cols + c) * out;
      if (to == DType::kF32) {
        std::memcpy(dst, &f, 4);
      } else {
        const uint16_t h = to == DType::kBF16 ? F32ToBF16Bits(f) : F32ToF16Bits(f);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  return y;
}

TEST_CASE("packed integers: bands, tables and ranges decode as the per-element definition",
          "[quant]") {
  struct Case {
    PackOrder order;
    uint32_t bits;
    bool zeros, g_idx;
  };
  const Case cases[] = {
      {PackOrder::kRows, 2, false, false}, {PackOrder::kRows, 4, true, false},
      {PackOrder::kRows, 4, false, true},  {PackOrder::kRows, 8, true, false},
      {PackOrder::kGptq, 2, true, false},  {PackOrder::kGptq, 3, true, false},
      {PackOrder::kGptq, 4, true, false},  {PackOrder::kGptq, 4, true, true},
      {PackOrder::kGptq, 8, true, false},  {PackOrder::kAwq, 4, true, false},
  };
  std::mt19937_64 rng(41);
  for (const Case& k : cases) {
    PackedIntState s;
    s.order = k.order;
    s.bits = k.bits;
    s.rows = k.order == PackOrder::kAwq ? 72 : 70;       // bands of 32 rows: 2 and a bit
    s.cols = k.order == PackOrder::kRows ? 1100 : 1120;  // band columns of 1024: one and a bit
    s.groups = 10;
    s.group_size = (s.cols + s.groups - 1) / s.groups;
    s.scale_dtype = k.order == PackOrder::kRows ? DType::kBF16 : DType::kF16;
    for (uint64_t i = 0; k.zeros && i < s.rows * s.groups; ++i) {
      s.zeros.push_back(static_cast<int16_t>(rng() % (1u << k.bits)));
    }
    for (uint64_t i = 0; k.g_idx && i < s.cols; ++i) {
      s.g_idx.push_back(static_cast<int32_t>(rng() % s.groups));
    }
    std::vector<std::byte> words(s.words() * 4), scales(s.rows * s.groups * 2);
    for (auto& b : words) b = static_cast<std::byte>(rng());
    for (uint64_t i = 0; i < scales.size(); i += 2) {  // finite normal halves
      scales[i] = static_cast<std::byte>(rng());
      scales[i + 1] = static_cast<std::byte>(0x20 + rng() % 0x1C);
    }
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO("order " << static_cast<int>(k.order) << ", bits " << k.bits << ", zeros " << k.zeros
                    << ", g_idx " << k.g_idx << ", to " << TorchName(to));
      const std::vector<std::byte> want = Reference(s, to, words, scales);
      const uint64_t n = s.rows * s.cols, out = DTypeBits(to) / 8;
      // The whole weight, then ranges from and to mid-row (a row of AWQ's eight included).
      const std::pair<uint64_t, uint64_t> ranges[] = {
          {0, n}, {3 * s.cols + 5, 40 * s.cols + 17}, {1, n - 1}, {9 * s.cols + 1000, 7}};
      for (const auto& [first, count] : ranges) {
        INFO("elements " << first << " + " << count);
        const uint64_t first_word = WordOf(s, first);
        std::vector<std::byte> got(count * out);
        REQUIRE(DequantPackedInt(s, to, words.data() + 4 * first_word, first_word, first, count,
                                 scales.data(), got.data())
                    .ok());
        CHECK(std::memcmp(got.data(), want.data() + first * out, got.size()) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace loadstone::convert
