// Reference conversions for the convert tests, written from the formats' definitions with
// double arithmetic (ldexp, nearbyint) and nothing from runtime/convert, so that they check
// the bit tricks there instead of repeating them.
#ifndef LOADSTONE_TESTS_RUNTIME_CONVERT_REFERENCE_H_
#define LOADSTONE_TESTS_RUNTIME_CONVERT_REFERENCE_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace loadstone::convert::testing {

// A binary float format: sign, exp_bits, man_bits. `fn` marks e4m3fn: no inf, and only the
// all-ones exponent with the all-ones mantissa is NaN.
struct Format {
  int exp_bits;
  int man_bits;
  bool fn = false;

  int Bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint32_t ExpOnes() const { return (1u << exp_bits) - 1; }
};

inline constexpr Format kF32{8, 23};
inline constexpr Format kF16{5, 10};
inline constexpr Format kBF16{8, 7};
inline constexpr Format kE4M3{4, 3, true};
inline constexpr Format kE5M2{5, 2};

inline bool IsNaNCode(Format f, uint32_t bits) {
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  const uint32_t exp = (bits >> f.man_bits) & f.ExpOnes();
  if (f.fn) return exp == f.ExpOnes() && man == (1u << f.man_bits) - 1;
  return exp == f.ExpOnes() && man != 0;
}

// The value of `bits` in format f (NaN for NaN codes).
inline double Decode(Format f, uint32_t bits) {
  const bool negative = (bits >> (f.exp_bits + f.man_bits)) & 1u;
  const uint32_t man = bits & ((1u << f.man_bits) - 1);
  const uint32_t exp = (bits >> f.man_bits) & f.ExpOnes();
  double v;
  if (IsNaNCode(f, bits)) {
    v = std::nan("");
  } else if (!f.fn && exp == f.ExpOnes()) {
    v = INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - f.Bias() - f.man_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits),
                   static_cast<int>(exp) - f.Bias());
  }
  return negative ? -v : v;
}

// Rounds the finite or infinite `v` to format f, to nearest with ties to even (nearbyint in
// the default rounding mode), as the bit pattern. A magnitude that rounds past the largest
// finite exponent becomes inf (for e4m3fn, the caller handles overflow first). NaN is the
// caller's business.
inline uint32_t RoundToFormat(Format f, double v) {
  const uint32_t sign = std::signbit(v) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  const double x = std::fabs(v);
  if (x == 0) return sign;
  const uint32_t inf = f.ExpOnes() << f.man_bits;
  if (std::isinf(x)) return sign | inf;
  const int emin = 1 - f.Bias();
  const int e = std::max(std::ilogb(x), emin);
  const double quantum = std::ldexp(1.0, e - f.man_bits);
  const double n = std::nearbyint(x / quantum);  // x / quantum is exact: a power of two
  const double rounded = n * quantum;
  if (rounded < std::ldexp(1.0, emin)) return sign | static_cast<uint32_t>(n);  // subnormal
  const int e2 = std::ilogb(rounded);
  const uint32_t exp_field = static_cast<uint32_t>(e2 + f.Bias());
  if (!f.fn && exp_field >= f.ExpOnes()) return sign | inf;
  const auto man = static_cast<uint32_t>(std::ldexp(rounded, f.man_bits - e2)) - (1u << f.man_bits);
  return sign | exp_field << f.man_bits | man;
}

inline float F32(uint32_t bits) { return std::bit_cast<float>(bits); }
inline uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Expected results of the spec's rules, from the reference above.
inline uint16_t RefF32ToBF16(uint32_t u) {
  if (std::isnan(F32(u))) return 0x7FC0;
  return static_cast<uint16_t>(RoundToFormat(kBF16, F32(u)));
}
inline uint16_t RefF32ToF16(uint32_t u) {
  if (std::isnan(F32(u))) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u);
  return static_cast<uint16_t>(RoundToFormat(kF16, F32(u)));
}
inline uint8_t RefF32ToE4M3(uint32_t u) {
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const float x = F32(u);
  if (std::isnan(x) || std::fabs(x) >= 480.0f) return sign | 0x7F;
  return static_cast<uint8_t>(RoundToFormat(kE4M3, x));
}
// The decoded f32 of a code that is not NaN (exact: every such value fits in f32).
inline uint32_t RefDecodeToF32(Format f, uint32_t bits) {
  return Bits(static_cast<float>(Decode(f, bits)));
}

// The seed for a randomized test: LOADSTONE_TEST_SEED when set, else a fresh one. Printed, so
// that a failure can be replayed.
inline uint64_t TestSeed(const char* test) {
  const char* env = std::getenv("LOADSTONE_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 0) : std::random_device{}();
  std::printf("%s: seed %llu (replay with LOADSTONE_TEST_SEED=%llu)\n", test,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

inline std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace loadstone::convert::testing

#endif  // LOADSTONE_TESTS_RUNTIME_CONVERT_REFERENCE_H_
