// f32 <-> f16 / bf16 and f16 <-> bf16: every 16-bit code, every rounding boundary, the spec's
// edge cases, and random sweeps, against the double-based reference (reference.h) and GCC's
// _Float16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cast_testing.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/float_bits.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

std::vector<uint16_t> All16() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// Every f32 input around each rounding boundary of a 16-bit target: for each finite code c,
// its value and the midpoint to the next code (and one f32 ulp either side of both).
std::vector<uint32_t> BoundaryInputs(Format f, uint32_t max_finite) {
  std::vector<uint32_t> in;
  for (uint32_t c = 0; c <= max_finite; ++c) {
    const double v = Decode(f, c);
    const double next = c == max_finite ? std::ldexp(1.0, f.Bias() + 1) : Decode(f, c + 1);
    for (double p : {v, (v + next) / 2}) {
      const uint32_t u = Bits(static_cast<float>(p));
      REQUIRE(static_cast<double>(F32(u)) == p);  // every boundary is an f32
      for (uint32_t w : {u - 1, u, u + 1}) {
        if (w > 0x7F800000u) continue;
        in.push_back(w);
        in.push_back(w | 0x80000000u);
      }
    }
  }
  return in;
}

// The element functions are constexpr; spot values, checked by the compiler.
static_assert(F32ToF16Bits(0x7FC00000u) == 0x7E00);   // NaN
static_assert(F32ToF16Bits(0x33000000u) == 0x0000);   // 2^-25: tie -> 0
static_assert(F32ToF16Bits(0x33C00000u) == 0x0002);   // 3 * 2^-25: tie -> 2
static_assert(F16ToF32Bits(0x0001) == 0x33800000u);   // 2^-24
static_assert(F16ToF32Bits(0x7D00) == 0x7FE00000u);   // signalling NaN made quiet
static_assert(F8E4M3ToF32Bits(0x7E) == 0x43E00000u);  // 448
static_assert(F32ToF8E4M3Bits(0x43F00000u) == 0x7F);  // 480 -> NaN
static_assert(F64ToF32Bits(0x3FF0000000000000u) == 0x3F800000u);

TEST_CASE("bf16 -> f32 is exact for all 65536 codes, NaN payloads kept", "[convert]") {
  const auto in = All16();
  const auto out = Cast<uint32_t>(DType::kBF16, DType::kF32, in);
  for (uint32_t b = 0; b < 65536; ++b) {
    INFO("bf16 " << Hex(b));
    REQUIRE(out[b] == b << 16);
    if (!IsNaNCode(kBF16, b)) REQUIRE(out[b] == RefDecodeToF32(kBF16, b));
  }
}

TEST_CASE("f16 -> f32 is exact for all 65536 codes, NaN made quiet with its payload", "[convert]") {
  const auto in = All16();
  const auto out = Cast<uint32_t>(DType::kF16, DType::kF32, in);
  for (uint32_t h = 0; h < 65536; ++h) {
    INFO("f16 " << Hex(h));
    if (IsNaNCode(kF16, h)) {
      REQUIRE(out[h] == (((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13)));
    } else {
      REQUIRE(out[h] == RefDecodeToF32(kF16, h));
    }
  }
  // Spot values, by hand: smallest subnormal, largest subnormal, smallest normal, max, -0.
  CHECK(F32(out[0x0001]) == std::ldexp(1.0f, -24));
  CHECK(F32(out[0x03FF]) == 1023 * std::ldexp(1.0f, -24));
  CHECK(F32(out[0x0400]) == std::ldexp(1.0f, -14));
  CHECK(F32(out[0x7BFF]) == 65504.0f);
  CHECK(out[0x8000] == 0x80000000u);
  CHECK(out[0x7C00] == 0x7F800000u);
  CHECK(out[0xFC00] == 0xFF800000u);
}

TEST_CASE("f32 -> bf16: the spec's ties, NaN, overflow and subnormals", "[convert]") {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3F808000u, 0x3F80},  // tie, even stays
      {0x3F818000u, 0x3F82},  // tie, odd rounds up
      {0x3F808001u, 0x3F81},  // just above the tie
      {0x3F807FFFu, 0x3F80},  // just below
      {0x3F800000u, 0x3F80},  // 1.0
      {0x7FC00000u, 0x7FC0},  // NaN
      {0xFFC00000u, 0x7FC0},  // negative NaN: sign dropped
      {0x7F800001u, 0x7FC0},  // signalling NaN
      {0xFFFFFFFFu, 0x7FC0},  // negative NaN, all payload bits
      {0x7F800000u, 0x7F80},  // inf
      {0xFF800000u, 0xFF80},  // -inf
      {0x7F7FFFFFu, 0x7F80},  // FLT_MAX rounds to inf
      {0x7F7F7FFFu, 0x7F7F},  // below the overflow tie
      {0x7F7F8000u, 0x7F80},  // max bf16 + half ulp: tie, 0x7F7F is odd -> inf
      {0xFF7F8000u, 0xFF80},  // the same, negative
      {0x00000000u, 0x0000},  // +0
      {0x80000000u, 0x8000},  // -0
      {0x00008000u, 0x0000},  // f32 subnormal tie -> even 0
      {0x00018000u, 0x0002},  // f32 subnormal tie -> even 2
      {0x00008001u, 0x0001},  // above the tie
  };
  std::vector<uint32_t> in;
  for (const Case& c : cases) in.push_back(c.in);
  const auto out = Cast<uint16_t>(DType::kF32, DType::kBF16, in);
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("f32 " << Hex(in[i]));
    CHECK(out[i] == cases[i].out);
    CHECK(RefF32ToBF16(in[i]) == cases[i].out);
  }
  static_assert(F32ToBF16Bits(0x3F808000u) == 0x3F80 && F32ToBF16Bits(0x3F818000u) == 0x3F82);
}

TEST_CASE("f32 -> f16: the spec's overflow, NaN and subnormal cases", "[convert]") {
  struct Case {
    float in;
    uint16_t out;
  };
  const Case cases[] = {
      {65520.0f, 0x7C00},  // the overflow threshold: a tie that rounds to inf
      {-65520.0f, 0xFC00},
      {65519.99f, 0x7BFF},  // 65519.996..., below the threshold: 65504
      {65504.0f, 0x7BFF},
      {1e10f, 0x7C00},
      {INFINITY, 0x7C00},
      {-INFINITY, 0xFC00},
      {1.0f, 0x3C00},
      {1.0f + std::ldexp(1.0f, -11), 0x3C00},      // tie, even stays
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3C02},  // tie, odd rounds up
      {std::ldexp(1.0f, -24), 0x0001},             // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},             // tie between 0 and 2^-24 -> 0
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},
      {3 * std::ldexp(1.0f, -25), 0x0002},  // tie 1.5 -> 2
      {-3 * std::ldexp(1.0f, -25), 0x8002},
      {1023 * std::ldexp(1.0f, -24), 0x03FF},                   // largest subnormal
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400},  // tie, 0x3FF odd -> up
      {std::ldexp(1.0f, -14), 0x0400},                          // smallest normal
      {std::ldexp(1.0f, -130), 0x0000},                         // f32 subnormal
      {-0.0f, 0x8000},
      {0.0f, 0x0000},
  };
  std::vector<uint32_t> in;
  for (const Case& c : cases) in.push_back(Bits(c.in));
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA00000u, 0x7FFFFFFFu}) {
    in.push_back(nan);
  }
  const auto out = Cast<uint16_t>(DType::kF32, DType::kF16, in);
  const size_t n = std::size(cases);
  for (size_t i = 0; i < n; ++i) {
    INFO("f32 " << cases[i].in << " " << Hex(in[i]));
    CHECK(out[i] == cases[i].out);
    CHECK(RefF32ToF16(in[i]) == cases[i].out);
  }
  CHECK(out[n + 0] == 0x7E00);  // NaN -> 0x7E00 | sign
  CHECK(out[n + 1] == 0xFE00);
  CHECK(out[n + 2] == 0x7E00);
  CHECK(out[n + 3] == 0xFE00);
  CHECK(out[n + 4] == 0x7E00);
}

TEST_CASE("f32 -> f16 and f32 -> bf16 agree with the reference at every rounding boundary",
          "[convert]") {
  struct Target {
    DType dtype;
    Format format;
    uint32_t max_finite;
    uint16_t (*ref)(uint32_t);
  };
  for (const Target& t : {Target{DType::kF16, kF16, 0x7BFF, RefF32ToF16},
                          Target{DType::kBF16, kBF16, 0x7F7F, RefF32ToBF16}}) {
    const auto in = BoundaryInputs(t.format, t.max_finite);
    const auto out = Cast<uint16_t>(DType::kF32, t.dtype, in);
    size_t bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      if (out[i] != t.ref(in[i]) && bad++ < 5) {
        FAIL_CHECK(TorchName(t.dtype) << ": f32 " << Hex(in[i]) << " -> " << Hex(out[i])
                                      << ", reference " << Hex(t.ref(in[i])));
      }
    }
    CHECK(bad == 0);
    CHECK(in.size() > 6 * 2 * 0x7BFF);
  }
}

TEST_CASE("GCC's _Float16 conversions are RNE with subnormals here, and agree", "[convert]") {
  // _Float16 is used below as a second oracle; first prove it is one. On x86-64 without
  // AVX512-FP16, GCC calls libgcc's soft-float conversions.
  const auto in = BoundaryInputs(kF16, 0x7BFF);
  for (uint32_t u : in) {
    const auto h = static_cast<_Float16>(F32(u));
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    INFO("f32 " << Hex(u));
    REQUIRE(hb == RefF32ToF16(u));
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    if (IsNaNCode(kF16, b)) continue;
    _Float16 h;
    const auto b16 = static_cast<uint16_t>(b);
    std::memcpy(&h, &b16, 2);
    INFO("f16 " << Hex(b));
    REQUIRE(Bits(static_cast<float>(h)) == RefDecodeToF32(kF16, b));
  }
}

TEST_CASE("random f32 -> f16 / bf16 sweep against _Float16 and the reference", "[convert]") {
  std::mt19937_64 rng(TestSeed("f32->f16/bf16 sweep"));
  constexpr size_t kCount = 1 << 20;
  std::vector<uint32_t> in(kCount);
  // Half uniform bit patterns (every exponent), half values spread over the f16 range.
  for (size_t i = 0; i < kCount; i += 2) {
    in[i] = static_cast<uint32_t>(rng());
    const auto e = static_cast<int>(rng() % 44) - 28;
    in[i + 1] = Bits(std::ldexp(static_cast<float>(rng() % (1u << 24)) / (1u << 24), e + 1)) ^
                static_cast<uint32_t>(rng() & 0x80000000u);
  }
  const auto f16 = Cast<uint16_t>(DType::kF32, DType::kF16, in);
  const auto bf16 = Cast<uint16_t>(DType::kF32, DType::kBF16, in);
  size_t bad = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const float x = F32(in[i]);
    uint16_t gcc = 0x7E00;
    if (!std::isnan(x)) {
      const auto h = static_cast<_Float16>(x);
      std::memcpy(&gcc, &h, 2);
    } else {
      gcc = static_cast<uint16_t>((in[i] >> 16 & 0x8000u) | 0x7E00u);
    }
    if ((f16[i] != gcc || bf16[i] != RefF32ToBF16(in[i])) && bad++ < 5) {
      FAIL_CHECK("f32 " << Hex(in[i]) << ": f16 " << Hex(f16[i]) << " (gcc " << Hex(gcc)
                        << "), bf16 " << Hex(bf16[i]) << " (ref " << Hex(RefF32ToBF16(in[i]))
                        << ")");
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("f16 <-> bf16 go through f32: all 65536 codes each way", "[convert]") {
  const auto in = All16();
  const auto to_bf16 = Cast<uint16_t>(DType::kF16, DType::kBF16, in);
  const auto to_f16 = Cast<uint16_t>(DType::kBF16, DType::kF16, in);
  for (uint32_t c = 0; c < 65536; ++c) {
    INFO("code " << Hex(c));
    const uint16_t want_bf16 =
        IsNaNCode(kF16, c) ? uint16_t{0x7FC0} : RefF32ToBF16(RefDecodeToF32(kF16, c));
    REQUIRE(to_bf16[c] == want_bf16);
    REQUIRE(to_f16[c] == RefF32ToF16(c << 16));
  }
  CHECK(to_f16[0x4780] == 0x7C00);   // bf16 65536 overflows f16
  CHECK(to_f16[0x0001] == 0x0000);   // a bf16 subnormal is far below f16's range
  CHECK(to_bf16[0x0001] == 0x3380);  // 2^-24 is a normal bf16
}

}  // namespace
}  // namespace loadstone::convert
