// Element-wise float conversions on raw bit patterns, exactly as specs/quant.md ("Float
// conversions (as PyTorch does them)") defines them. These are the scalar contract that the
// buffer loops in cast.cc apply and that device kernels are tested against.
//
// Every function is branch-free: each candidate result is computed and one is picked
// (Select), so a loop over them auto-vectorizes. The subnormal paths use one float
// addition or subtraction; they assume the default floating point environment (round to
// nearest even), which loadstone never changes.
#ifndef LOADSTONE_RUNTIME_CONVERT_FLOAT_BITS_H_
#define LOADSTONE_RUNTIME_CONVERT_FLOAT_BITS_H_

#include <bit>
#include <cstdint>
#include <type_traits>

namespace loadstone::convert {

// c ? x : y where both x and y are already computed, so the compiler can pick with a blend
// instead of a jump. (cast.cc is built with -fno-trapping-math so that GCC does so even when
// a float addition feeds one side; otherwise it may move the addition into a branch.)
template <typename T>
constexpr T Select(bool c, T x, T y) {
  static_assert(std::is_unsigned_v<T>);
  return c ? x : y;
}

// bfloat16 <-> float32 --------------------------------------------------------------------

// Round to nearest even; overflow becomes inf; every NaN becomes 0x7FC0 (sign dropped).
constexpr uint16_t F32ToBF16Bits(uint32_t f) {
  const uint32_t rounded = (f + 0x7FFFu + ((f >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(Select((f & 0x7FFFFFFFu) > 0x7F800000u, 0x7FC0u, rounded));
}

// Exact: the bf16 bits are the top half of the f32 (a NaN is kept as it is).
constexpr uint32_t BF16ToF32Bits(uint16_t b) { return static_cast<uint32_t>(b) << 16; }

// float16 <-> float32 ---------------------------------------------------------------------

// Round to nearest even, subnormals included; |x| >= 65520 becomes inf; NaN becomes
// 0x7E00 | sign.
constexpr uint16_t F32ToF16Bits(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t a = f & 0x7FFFFFFFu;
  // Normal results: rebias the exponent (127 -> 15), then round the 13 dropped bits to even.
  // A mantissa carry moves into the exponent, which is what rounding up should do.
  const uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal results (|x| < 2^-14): in 0.5 + |x| the float unit in the last place is 2^-24,
  // the f16 subnormal step, so the addition rounds to the f16 grid. A result of 0x400 (rounded
  // up to the smallest normal) is the right bit pattern too.
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - std::bit_cast<uint32_t>(0.5f);
  uint32_t h = Select(a < 0x38800000u, sub, normal);  // 0x38800000 = 2^-14
  h = Select(a >= 0x477FF000u, 0x7C00u, h);           // 0x477FF000 = 65520
  h = Select(a > 0x7F800000u, 0x7E00u, h);
  return static_cast<uint16_t>(sign | h);
}

// Exact, subnormals included; a NaN keeps its payload and is made quiet (as c10 and F16C do).
constexpr uint32_t F16ToF32Bits(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t a = h & 0x7FFFu;
  const uint32_t normal = (a << 13) + (112u << 23);  // rebias 15 -> 127
  // m * 2^-24 = (1 + m/1024) * 2^-14 - 2^-14, computed exactly (both operands are close).
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>((113u << 23) | (a << 13)) -
                                               std::bit_cast<float>(113u << 23));
  // Inf keeps its pattern; a NaN (nonzero mantissa) also gets the quiet bit 0x00400000.
  const uint32_t quiet = (((a & 0x3FFu) + 0x3FFu) & 0x400u) << 12;
  const uint32_t inf_nan = 0x7F800000u | (a << 13) | quiet;
  uint32_t r = Select(a < 0x0400u, sub, normal);
  r = Select(a >= 0x7C00u, inf_nan, r);
  return sign | r;
}

// float8 ----------------------------------------------------------------------------------
// Every float8 value is exact in f32, f16 and bf16, so each target has its own formula, in
// 16-bit lanes where it can; each equals encoding the f32 decode (the tests check all codes).

// e4m3fn (s eeee mmm, bias 7, no inf): 0x7F and 0xFF are the only NaNs; they decode to
// sign | 0x7FF00000, the pattern c10's decoder gives. Every value has a zero low f32 half, so
// this gives the top 16 bits.
constexpr uint16_t F8E4M3ToF32High(uint8_t b) {
  using U16 = uint16_t;
  const auto sign = static_cast<U16>((b & 0x80u) << 8);
  const U16 a = b & 0x7Fu;
  const auto normal = static_cast<U16>((a << 4) + (120u << 7));  // rebias 7 -> 127
  // Subnormal m * 2^-9 (m = a < 8) is normal in f32: its exponent comes from m's top bit.
  U16 sub = Select<U16>(a == 1u, 118u << 7, 0);
  sub = Select<U16>(a >= 2u, (a << 6) + (118u << 7), sub);  // m = 2, 3
  sub = Select<U16>(a >= 4u, (a << 5) + (119u << 7), sub);  // m = 4..7
  U16 r = Select(a < 8u, sub, normal);
  r = Select<U16>(a == 0x7Fu, 0x7FF0u, r);
  return static_cast<U16>(sign | r);
}
constexpr uint32_t F8E4M3ToF32Bits(uint8_t b) {
  return static_cast<uint32_t>(F8E4M3ToF32High(b)) << 16;
}
// NaN becomes 0x7FC0, as F32ToBF16Bits makes it.
constexpr uint16_t F8E4M3ToBF16Bits(uint8_t b) {
  return Select<uint16_t>((b & 0x7Fu) == 0x7Fu, 0x7FC0u, F8E4M3ToF32High(b));
}
// NaN becomes 0x7E00 | sign, as F32ToF16Bits makes it.
constexpr uint16_t F8E4M3ToF16Bits(uint8_t b) {
  using U16 = uint16_t;
  const auto sign = static_cast<U16>((b & 0x80u) << 8);
  const U16 a = b & 0x7Fu;
  const auto normal = static_cast<U16>((a << 7) + (8u << 10));  // rebias 7 -> 15
  U16 sub = Select<U16>(a == 1u, 6u << 10, 0);                  // 2^-9 is normal in f16
  sub = Select<U16>(a >= 2u, (a << 9) + (6u << 10), sub);
  sub = Select<U16>(a >= 4u, (a << 8) + (7u << 10), sub);
  U16 r = Select(a < 8u, sub, normal);
  r = Select<U16>(a == 0x7Fu, 0x7E00u, r);
  return static_cast<U16>(sign | r);
}

// e5m2 (s eeeee mm) is the top byte of an f16 and decodes as F16ToF32Bits(b << 8): exact, inf
// as inf, a NaN made quiet with its payload kept.
constexpr uint32_t F8E5M2ToF32Bits(uint8_t b) {
  return F16ToF32Bits(static_cast<uint16_t>(static_cast<uint16_t>(b) << 8));
}
// NaN becomes 0x7E00 | sign, as F32ToF16Bits makes it.
constexpr uint16_t F8E5M2ToF16Bits(uint8_t b) {
  const auto h = static_cast<uint16_t>(b << 8);
  return Select<uint16_t>((b & 0x7Fu) > 0x7Cu, (h & 0x8000u) | 0x7E00u, h);
}
// NaN becomes 0x7FC0 (sign dropped), as F32ToBF16Bits makes it.
constexpr uint16_t F8E5M2ToBF16Bits(uint8_t b) {
  using U16 = uint16_t;
  const auto sign = static_cast<U16>((b & 0x80u) << 8);
  const U16 a = b & 0x7Fu;
  const auto normal = static_cast<U16>((a << 5) + (112u << 7));  // rebias 15 -> 127
  U16 sub = Select<U16>(a == 1u, 111u << 7, 0);                  // m * 2^-16
  sub = Select<U16>(a >= 2u, (a << 6) + (111u << 7), sub);
  U16 r = Select(a < 4u, sub, normal);
  r = Select<U16>(a == 0x7Cu, 0x7F80u, r);  // inf
  return Select<U16>(a > 0x7Cu, 0x7FC0u, sign | r);
}

// f32 -> e4m3fn: |x| >= 480, inf and NaN become NaN (0x7F | sign); otherwise round to nearest
// even, which sends (464, 480) to 0x7F as well and 464 (a tie) to 448.
constexpr uint8_t F32ToF8E4M3Bits(uint32_t f) {
  const uint32_t sign = (f >> 24) & 0x80u;
  const uint32_t a = f & 0x7FFFFFFFu;
  const uint32_t normal = (a - (120u << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  // |x| < 2^-6: in 2^14 + |x| the unit in the last place is 2^-9, the e4m3 subnormal step.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 16384.0f) -
                       std::bit_cast<uint32_t>(16384.0f);
  uint32_t r = Select(a < 0x3C800000u, sub, normal);  // 0x3C800000 = 2^-6
  r = Select(a >= 0x43F00000u, 0x7Fu, r);             // 0x43F00000 = 480, also inf and NaN
  return static_cast<uint8_t>(sign | r);
}

// f64 narrows to f32 first (round to nearest even), as c10 does: Half and BFloat16 have no
// constructor from double. Rounding twice can differ from rounding once by one unit in the
// last place (when the f32 lands exactly on a tie); loadstone matches PyTorch.
constexpr uint32_t F64ToF32Bits(uint64_t d) {
  return std::bit_cast<uint32_t>(static_cast<float>(std::bit_cast<double>(d)));
}

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_FLOAT_BITS_H_
