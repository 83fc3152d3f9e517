// Block-scaled FP8 dequantization: every code of both formats times a range of scales into
// every target, against the formats' definitions (double arithmetic, reference.h); bf16 and f16
// scales (compressed-tensors); the block indexing on ragged DeepSeek-style edges, whole and in
// arbitrary pieces; layout errors.
#include "runtime/convert/fp8_block.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "reference.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

// The expected f32 bits of code * scale: the exact product in double, rounded once to f32.
uint32_t RefScaled(Format f, uint8_t code, float scale) {
  return RoundToFormat(kF32, Decode(f, code) * static_cast<double>(scale));
}

// Expected target bits from f32 bits, by the reference rules.
uint32_t RefEncode(DType to, uint32_t f32) {
  switch (to) {
    case DType::kF16:
      return RefF32ToF16(f32);
    case DType::kBF16:
      return RefF32ToBF16(f32);
    default:
      return f32;
  }
}

bool IsNaNIn(DType to, uint32_t bits) {
  switch (to) {
    case DType::kF16:
      return (bits & 0x7C00u) == 0x7C00u && (bits & 0x3FFu) != 0;
    case DType::kBF16:
      return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0;
    default:
      return std::isnan(F32(bits));
  }
}

std::vector<uint32_t> Dequant(DType from, DType to, const std::vector<uint8_t>& codes,
                              const std::vector<float>& scales, uint64_t cols, uint64_t block_rows,
                              uint64_t block_cols, uint64_t first, uint64_t count) {
  const Fp8BlockScales layout{reinterpret_cast<const std::byte*>(scales.data()), cols, block_rows,
                              block_cols, (cols + block_cols - 1) / block_cols};
  const uint64_t out_bytes = DTypeBits(to) / 8;
  std::vector<std::byte> out(count * out_bytes);
  REQUIRE(DequantFp8Block(from, to, reinterpret_cast<const std::byte*>(codes.data()) + first,
                          out.data(), first, count, layout)
              .ok());
  std::vector<uint32_t> bits(count);
  for (uint64_t i = 0; i < count; ++i) std::memcpy(&bits[i], out.data() + i * out_bytes, out_bytes);
  return bits;
}

TEST_CASE("fp8 block dequant: all 256 codes times scales, into f32, f16 and bf16",
          "[convert][fp8]") {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  // Typical DeepSeek scales, exact powers of two, a negative one, ones that push products into
  // f16 overflow (448 * 200 > 65504), f32 subnormals, and f32 overflow.
  const float scale_values[] = {1.0f,   0.5f,   3.0517578e-05f, 1.7e-4f, 0.0123f,
                                -2.75f, 200.0f, 1e-38f,         3e38f,   0.0f};
  for (DType from : {DType::kF8E4M3, DType::kF8E5M2}) {
    const Format f = from == DType::kF8E4M3 ? kE4M3 : kE5M2;
    for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (float scale : scale_values) {
        // One row of 256 codes in one block: every code sees `scale`.
        const auto got = Dequant(from, to, codes, {scale}, 256, 1, 256, 0, 256);
        for (int c = 0; c < 256; ++c) {
          INFO(TorchName(from) << " -> " << TorchName(to) << " code " << Hex(c) << " scale "
                               << scale);
          if (IsNaNCode(f, c)) {
            CHECK(IsNaNIn(to, got[c]));
          } else if (std::isinf(Decode(f, c)) && scale == 0.0f) {
            CHECK(IsNaNIn(to, got[c]));  // inf * 0
          } else {
            CHECK(got[c] == RefEncode(to, RefScaled(f, static_cast<uint8_t>(c), scale)));
          }
        }
      }
    }
  }
}

TEST_CASE("fp8 block dequant: bf16 and f16 scales round the product in their own dtype",
          "[convert][fp8]") {
  // compressed-tensors computes x_q.to(scale.dtype) * scale: the exact product rounded once to
  // the scale's dtype, then cast to the target.
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  const double wanted_scales[] = {1.0, 0.5, 3.0517578e-05, 1.7e-4, 0.0123, -2.75, 200.0, 1e-3};
  for (DType scale_dtype : {DType::kBF16, DType::kF16}) {
    const Format sf = scale_dtype == DType::kBF16 ? kBF16 : kF16;
    for (DType from : {DType::kF8E4M3, DType::kF8E5M2}) {
      const Format f = from == DType::kF8E4M3 ? kE4M3 : kE5M2;
      for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (double wanted : wanted_scales) {
          const auto scale_bits = static_cast<uint16_t>(RoundToFormat(sf, wanted));
          const double scale = Decode(sf, scale_bits);
          std::byte stored[2];
          std::memcpy(stored, &scale_bits, 2);
          const Fp8BlockScales layout{stored, 256, 1, 256, 1, scale_dtype};
          std::vector<std::byte> out(256 * DTypeBits(to) / 8);
          REQUIRE(DequantFp8Block(from, to, reinterpret_cast<const std::byte*>(codes.data()),
                                  out.data(), 0, 256, layout)
                      .ok());
          for (int c = 0; c < 256; ++c) {
            INFO(TorchName(from) << " -> " << TorchName(to) << " code " << Hex(c) << " scale "
                                 << scale << " (" << TorchName(scale_dtype) << ")");
            uint32_t got = 0;
            std::memcpy(&got, out.data() + c * DTypeBits(to) / 8, DTypeBits(to) / 8);
            if (IsNaNCode(f, c)) {
              CHECK(IsNaNIn(to, got));
              continue;
            }
            const uint32_t in_scale_dtype = RoundToFormat(sf, Decode(f, c) * scale);
            const uint32_t as_f32 = Bits(static_cast<float>(Decode(sf, in_scale_dtype)));
            CHECK(got == RefEncode(to, as_f32));
          }
        }
      }
    }
  }
  // A scale dtype that is not a float of 16 or 32 bits is refused.
  const std::byte none[4] = {};
  std::byte in[4] = {}, out[16] = {};
  const Fp8BlockScales int_scales{none, 4, 1, 4, 1, DType::kI32};
  const Status s = DequantFp8Block(DType::kF8E4M3, DType::kF32, in, out, 0, 4, int_scales);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("int32") != std::string::npos);
}

TEST_CASE("fp8 block dequant: ragged 128 x 128 blocks, whole and in pieces", "[convert][fp8]") {
  std::mt19937_64 rng(TestSeed("fp8 block ragged"));
  const uint64_t rows = 300, cols = 200, block = 128;  // scales 3 x 2, last blocks partial
  std::vector<uint8_t> codes(rows * cols);
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7F) == 0x7F);  // no NaN codes here
  }
  std::vector<float> scales(3 * 2);
  for (auto& s : scales)
    s = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -int(rng() % 12));
  const auto whole =
      Dequant(DType::kF8E4M3, DType::kBF16, codes, scales, cols, block, block, 0, rows * cols);
  for (uint64_t i = 0; i < rows; ++i) {
    for (uint64_t j = 0; j < cols; ++j) {
      const float s = scales[(i / block) * 2 + j / block];
      const uint32_t want = RefEncode(DType::kBF16, RefScaled(kE4M3, codes[i * cols + j], s));
      if (whole[i * cols + j] != want) {
        FAIL("element [" << i << "][" << j << "]: " << Hex(whole[i * cols + j])
                         << " != " << Hex(want));
      }
    }
  }
  // Pieces that start and end anywhere (mid-row, mid-block) give the same elements.
  for (int trial = 0; trial < 50; ++trial) {
    const uint64_t first = rng() % (rows * cols);
    const uint64_t count = 1 + rng() % (rows * cols - first);
    const auto piece =
        Dequant(DType::kF8E4M3, DType::kBF16, codes, scales, cols, block, block, first, count);
    INFO("piece " << first << " + " << count);
    CHECK(std::equal(piece.begin(), piece.end(), whole.begin() + first));
  }
  // Per-channel scales are the same rule: a block of one row and every column.
  std::vector<float> per_row(rows);
  for (uint64_t i = 0; i < rows; ++i) per_row[i] = 0.25f * static_cast<float>(i + 1);
  const auto channel =
      Dequant(DType::kF8E4M3, DType::kF32, codes, per_row, cols, 1, cols, 0, rows * cols);
  CHECK(F32(channel[5 * cols + 7]) ==
        static_cast<float>(Decode(kE4M3, codes[5 * cols + 7])) * 1.5f);
}

TEST_CASE("fp8 block dequant: bad dtypes and layouts are InvalidArgument", "[convert][fp8]") {
  const std::vector<float> scale = {1.0f};
  std::byte in[4] = {}, out[16] = {};
  const Fp8BlockScales ok{reinterpret_cast<const std::byte*>(scale.data()), 4, 128, 128, 1};
  CHECK(DequantFp8Block(DType::kF8E4M3, DType::kF16, in, out, 0, 4, ok).ok());
  CHECK(DequantFp8Block(DType::kF16, DType::kF32, in, out, 0, 2, ok).code() ==
        StatusCode::kInvalidArgument);
  CHECK(DequantFp8Block(DType::kF8E4M3, DType::kF8E5M2, in, out, 0, 4, ok).code() ==
        StatusCode::kInvalidArgument);
  CHECK_FALSE(CanDequantFp8Block(DType::kF8E4M3, DType::kI8));
  Fp8BlockScales bad = ok;
  bad.scale_cols = 2;  // 4 columns in blocks of 128 have one scale per row
  const Status s = DequantFp8Block(DType::kF8E4M3, DType::kF32, in, out, 0, 4, bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("need 1 scales per row, not 2") != std::string::npos);
  bad = ok;
  bad.block_rows = 0;
  CHECK(DequantFp8Block(DType::kF8E4M3, DType::kF32, in, out, 0, 4, bad).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loadstone::convert
