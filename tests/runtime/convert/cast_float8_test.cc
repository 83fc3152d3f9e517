// float8 e4m3fn and e5m2: all 256 codes to each target, against the format definitions and
// values worked out by hand; and the f32 -> e4m3fn encoder.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cast_testing.h"
#include "runtime/convert/cast.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

std::vector<uint8_t> All8() {
  std::vector<uint8_t> v(256);
  for (int i = 0; i < 256; ++i) v[i] = static_cast<uint8_t>(i);
  return v;
}

std::vector<uint8_t> EncodeE4M3(const std::vector<uint32_t>& in) {
  std::vector<uint8_t> out(in.size());
  CastF32ToF8E4M3(reinterpret_cast<const std::byte*>(in.data()),
                  reinterpret_cast<std::byte*>(out.data()), in.size());
  return out;
}

TEST_CASE("e4m3fn: hand-checked values", "[convert]") {
  // s eeee mmm, bias 7: normal (1 + m/8) * 2^(e-7), subnormal m * 2^-9, no inf.
  struct Case {
    uint8_t code;
    float value;
  };
  const Case cases[] = {
      {0x00, 0.0f},         {0x01, 0.001953125f},                        // 2^-9
      {0x02, 0.00390625f},  {0x03, 0.005859375f}, {0x07, 0.013671875f},  // 7 * 2^-9
      {0x08, 0.015625f},                                                 // 2^-6, smallest normal
      {0x0F, 0.029296875f}, {0x30, 0.5f},         {0x38, 1.0f},          {0x39, 1.125f},
      {0x3F, 1.875f},       {0x40, 2.0f},         {0x47, 3.75f},         {0x50, 8.0f},
      {0x70, 128.0f},       {0x77, 240.0f},       {0x78, 256.0f},        {0x7D, 416.0f},
      {0x7E, 448.0f},  // max
      {0xB8, -1.0f},        {0xFE, -448.0f},      {0x81, -0.001953125f},
  };
  const auto to_f32 = Cast<uint32_t>(DType::kF8E4M3, DType::kF32, All8());
  for (const Case& c : cases) {
    INFO("e4m3 " << Hex(c.code));
    CHECK(F32(to_f32[c.code]) == c.value);
    CHECK(Decode(kE4M3, c.code) == c.value);
  }
  CHECK(to_f32[0x80] == 0x80000000u);  // -0
  CHECK(to_f32[0x7F] == 0x7FF00000u);  // the only NaNs, as c10 decodes them
  CHECK(to_f32[0xFF] == 0xFFF00000u);
  // 0x78..0x7E are normal numbers (no inf in e4m3fn): values increase along the codes.
  for (int c = 1; c <= 0x7E; ++c) {
    INFO("e4m3 " << Hex(c));
    CHECK(F32(to_f32[c]) > F32(to_f32[c - 1]));
    CHECK(F32(to_f32[0x80 | c]) == -F32(to_f32[c]));
  }
}

TEST_CASE("e4m3fn -> f32 / bf16 / f16: all 256 codes", "[convert]") {
  const auto in = All8();
  const auto f32 = Cast<uint32_t>(DType::kF8E4M3, DType::kF32, in);
  const auto bf16 = Cast<uint16_t>(DType::kF8E4M3, DType::kBF16, in);
  const auto f16 = Cast<uint16_t>(DType::kF8E4M3, DType::kF16, in);
  for (uint32_t c = 0; c < 256; ++c) {
    INFO("e4m3 " << Hex(c));
    if (IsNaNCode(kE4M3, c)) {
      CHECK((c & 0x7F) == 0x7F);
      CHECK(bf16[c] == 0x7FC0);
      CHECK(f16[c] == ((c & 0x80u) << 8 | 0x7E00u));
      continue;
    }
    const uint32_t want = RefDecodeToF32(kE4M3, c);
    CHECK(f32[c] == want);
    CHECK(bf16[c] == want >> 16);  // exact in bf16
    CHECK(f16[c] == RefF32ToF16(want));
    CHECK(Decode(kF16, f16[c]) == F32(want));  // exact in f16
  }
}

TEST_CASE("e5m2: all 256 codes, the top byte of an f16", "[convert]") {
  const auto in = All8();
  const auto f32 = Cast<uint32_t>(DType::kF8E5M2, DType::kF32, in);
  const auto bf16 = Cast<uint16_t>(DType::kF8E5M2, DType::kBF16, in);
  const auto f16 = Cast<uint16_t>(DType::kF8E5M2, DType::kF16, in);
  for (uint32_t c = 0; c < 256; ++c) {
    INFO("e5m2 " << Hex(c));
    if (IsNaNCode(kE5M2, c)) {
      CHECK(f32[c] == (((c & 0x80u) << 24) | 0x7FC00000u | ((c & 3u) << 21)));
      CHECK(bf16[c] == 0x7FC0);
      CHECK(f16[c] == ((c & 0x80u) << 8 | 0x7E00u));
      continue;
    }
    CHECK(f32[c] == RefDecodeToF32(kE5M2, c));
    CHECK(f32[c] == RefDecodeToF32(kF16, c << 8));
    CHECK(f16[c] == c << 8);
    CHECK(bf16[c] == f32[c] >> 16);  // exact in bf16
  }
  CHECK(F32(f32[0x7B]) == 57344.0f);  // max
  CHECK(F32(f32[0x01]) == std::ldexp(1.0f, -16));
  CHECK(F32(f32[0x04]) == std::ldexp(1.0f, -14));
  CHECK(F32(f32[0x3C]) == 1.0f);
  CHECK(f32[0x7C] == 0x7F800000u);
  CHECK(f32[0xFC] == 0xFF800000u);
  CHECK(bf16[0xFC] == 0xFF80);
  CHECK(f32[0x7D] == 0x7FE00000u);  // a signalling f16 NaN, made quiet
}

TEST_CASE("f32 -> e4m3fn: the spec's cases", "[convert]") {
  struct Case {
    uint32_t in;
    uint8_t out;
  };
  const float two_m10 = std::ldexp(1.0f, -10);
  const Case cases[] = {
      {Bits(480.0f), 0x7F},  // |x| >= 480 -> NaN
      {Bits(-480.0f), 0xFF},
      {Bits(1e6f), 0x7F},
      {Bits(470.0f), 0x7F},  // rounds to the 480 slot, which is NaN
      {Bits(464.0f), 0x7E},  // tie between 448 and 480 -> 448 (even)
      {Bits(463.99f), 0x7E},
      {Bits(448.0f), 0x7E},
      {Bits(-464.0f), 0xFE},
      {0x7F800000u, 0x7F},  // inf -> NaN
      {0xFF800000u, 0xFF},
      {0x7FC00000u, 0x7F},
      {0xFFC00000u, 0xFF},
      {Bits(0.0f), 0x00},
      {Bits(-0.0f), 0x80},
      {Bits(1.0f), 0x38},
      {Bits(1.0625f), 0x38},  // tie 1.0 / 1.125 -> 1.0
      {Bits(1.1875f), 0x3A},  // tie 1.125 / 1.25 -> 1.25
      {Bits(std::ldexp(1.0f, -9)), 0x01},
      {Bits(two_m10), 0x00},  // tie 0 / 2^-9 -> 0
      {Bits(std::nextafter(two_m10, 1.0f)), 0x01},
      {Bits(3 * two_m10), 0x02},                     // tie 1 / 2 (x 2^-9) -> 2
      {Bits(std::ldexp(1.0f, -6) - two_m10), 0x08},  // tie 7 / 8 -> 8, the smallest normal
      {Bits(std::ldexp(1.0f, -6)), 0x08},
      {Bits(1e-30f), 0x00},
      {0x00000001u, 0x00},  // f32 subnormal
      {Bits(-0.3f), 0xAA},  // -0.3 -> -(1.25 * 2^-2) = -0.3125 (0.28125 is farther)
  };
  std::vector<uint32_t> in;
  for (const Case& c : cases) in.push_back(c.in);
  const auto out = EncodeE4M3(in);
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("f32 " << F32(in[i]) << " " << Hex(in[i]));
    CHECK(static_cast<int>(out[i]) == cases[i].out);
    CHECK(static_cast<int>(RefF32ToE4M3(in[i])) == cases[i].out);
  }
}

TEST_CASE("f32 -> e4m3fn at every rounding boundary, and a random sweep", "[convert]") {
  std::vector<uint32_t> in;
  for (uint32_t c = 0; c <= 0x7E; ++c) {
    const double v = Decode(kE4M3, c);
    const double next = c == 0x7E ? 480.0 : Decode(kE4M3, c + 1);
    for (double p : {v, (v + next) / 2}) {
      const uint32_t u = Bits(static_cast<float>(p));
      for (uint32_t w : {u - 1, u, u + 1}) {
        in.push_back(w);
        in.push_back(w | 0x80000000u);
      }
    }
  }
  std::mt19937_64 rng(TestSeed("f32->e4m3 sweep"));
  for (int i = 0; i < (1 << 18); ++i) {
    in.push_back(static_cast<uint32_t>(rng()));
    const auto e = static_cast<int>(rng() % 20) - 12;
    in.push_back(Bits(std::ldexp(static_cast<float>(rng() % (1u << 24)) / (1u << 24), e)));
  }
  const auto out = EncodeE4M3(in);
  size_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i] != RefF32ToE4M3(in[i]) && bad++ < 5) {
      FAIL_CHECK("f32 " << Hex(in[i]) << " -> " << Hex(out[i]) << ", reference "
                        << Hex(RefF32ToE4M3(in[i])));
    }
  }
  CHECK(bad == 0);
  // Decoding then encoding gives every code back (NaN: the sign survives).
  const auto decoded = Cast<uint32_t>(DType::kF8E4M3, DType::kF32, All8());
  const auto again = EncodeE4M3(decoded);
  for (int c = 0; c < 256; ++c) CHECK(static_cast<int>(again[c]) == c);
}

}  // namespace
}  // namespace loadstone::convert
