// The x86 conversion instructions as oracles: F16C (vcvtps2ph / vcvtph2ps, round to nearest
// even) for f16, AVX512-BF16 (vcvtneps2bf16) for bf16. They are used only when the CPU has
// them; otherwise the test says so and passes. The "[.exhaustive]" cases run every one of the
// 2^32 f32 inputs (seconds in a Release build): convert_test "[exhaustive]".
#include <immintrin.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cast_testing.h"
#include "runtime/convert/cast.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

bool HaveF16C() { return __builtin_cpu_supports("f16c"); }
bool HaveAvx512Bf16() {
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl");
}

__attribute__((target("f16c"))) void HwF32ToF16(const uint32_t* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const __m128 v = _mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(in[i])));
    out[i] = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0));
  }
}

__attribute__((target("f16c"))) uint32_t HwF16ToF32(uint16_t h) {
  return static_cast<uint32_t>(
      _mm_cvtsi128_si32(_mm_castps_si128(_mm_cvtph_ps(_mm_cvtsi32_si128(h)))));
}

// vcvtneps2bf16 treats f32 subnormal inputs as zero; callers skip those.
__attribute__((target("avx512bf16,avx512vl,avx512f"))) uint16_t HwF32ToBF16(uint32_t u) {
  const __m128bh r = _mm_cvtneps_pbh(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(u))));
  uint16_t out;
  std::memcpy(&out, &r, 2);
  return out;
}

// Round to nearest even on the dropped 16 bits, written as a comparison (runtime/convert adds
// a bias instead).
uint16_t CompareF32ToBF16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  const uint32_t top = u >> 16;
  const uint32_t rest = u & 0xFFFFu;
  const bool up = rest > 0x8000u || (rest == 0x8000u && (top & 1u) != 0);
  return static_cast<uint16_t>(top + (up ? 1 : 0));
}

// Checks f32 inputs first, first + stride, ... (2^32 of them at most) against the oracles.
void CheckF32Range(uint64_t first, uint64_t stride, uint64_t n) {
  const bool f16c = HaveF16C();
  const bool bf16_hw = HaveAvx512Bf16();
  if (!f16c) WARN("no F16C on this CPU: the f16 hardware oracle is skipped");
  if (!bf16_hw) WARN("no AVX512-BF16 on this CPU: the bf16 hardware oracle is skipped");
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<uint32_t> in(kChunk);
  std::vector<uint16_t> f16(kChunk), bf16(kChunk), hw(kChunk);
  uint64_t bad = 0;
  for (uint64_t start = 0; start < n; start += kChunk) {
    const uint64_t len = std::min(kChunk, n - start);
    for (uint64_t i = 0; i < len; ++i) {
      in[i] = static_cast<uint32_t>(first + (start + i) * stride);
    }
    const auto* src = reinterpret_cast<const std::byte*>(in.data());
    REQUIRE(CastBuffer(DType::kF32, DType::kF16, src, reinterpret_cast<std::byte*>(f16.data()), len)
                .ok());
    REQUIRE(
        CastBuffer(DType::kF32, DType::kBF16, src, reinterpret_cast<std::byte*>(bf16.data()), len)
            .ok());
    if (f16c) HwF32ToF16(in.data(), hw.data(), len);
    for (uint64_t i = 0; i < len; ++i) {
      const uint32_t u = in[i];
      const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
      // The hardware keeps NaN payloads; the spec (and c10) make every NaN 0x7E00 | sign.
      const uint16_t want16 = nan    ? static_cast<uint16_t>((u >> 16 & 0x8000u) | 0x7E00u)
                              : f16c ? hw[i]
                                     : f16[i];
      bool ok = f16[i] == want16 && bf16[i] == CompareF32ToBF16(u);
      const bool f32_subnormal = (u & 0x7F800000u) == 0;
      if (bf16_hw && !nan && !f32_subnormal) ok = ok && bf16[i] == HwF32ToBF16(u);
      if (!ok && bad++ < 5) {
        FAIL_CHECK("f32 " << Hex(u) << ": f16 " << Hex(f16[i]) << " (want " << Hex(want16)
                          << "), bf16 " << Hex(bf16[i]) << " (want " << Hex(CompareF32ToBF16(u))
                          << ")");
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("f16 -> f32 matches F16C for all 65536 codes, NaN payloads included", "[convert]") {
  if (!HaveF16C()) {
    WARN("skipped: no F16C on this CPU");
    return;
  }
  std::vector<uint16_t> in(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  const auto out = Cast<uint32_t>(DType::kF16, DType::kF32, in);
  for (uint32_t h = 0; h < 65536; ++h) {
    INFO("f16 " << Hex(h));
    REQUIRE(out[h] == HwF16ToF32(static_cast<uint16_t>(h)));
  }
}

TEST_CASE("f32 -> f16 / bf16 match the hardware on a spread of 2^32 inputs", "[convert]") {
  CheckF32Range(0, 65521, (uint64_t{1} << 32) / 65521 + 1);  // a prime stride: all exponents
  CheckF32Range(0x477FE000u, 1, 1 << 14);                    // around 65520
  CheckF32Range(0x33000000u, 1, 1 << 12);                    // around 2^-25
}

TEST_CASE("f32 -> f16 / bf16 match the hardware for all 2^32 inputs", "[.][exhaustive]") {
  CheckF32Range(0, 1, uint64_t{1} << 32);
}

}  // namespace
}  // namespace loadstone::convert
