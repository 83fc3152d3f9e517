// LibTorch (1.13 here) as the oracle: the same inputs through Tensor::to() must give the same
// bits. Built only when LibTorch is found (LOADSTONE_HAVE_TORCH).
//
// Where LibTorch disagrees with itself the spec decides, and the comparison says so:
// LibTorch 1.13's vectorized CPU kernel turns every f32 NaN into bf16 0xFFFF, while c10's
// scalar BFloat16 (and the spec) give 0x7FC0; for bf16 NaN results only NaN-ness is compared.
// LibTorch 1.13 has no float8 dtypes; cast_float8_test.cc covers those.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cast_testing.h"
#include "runtime/convert/cast.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

at::ScalarType TorchType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF64:
      return at::kDouble;
    default:
      FAIL("no torch type");
      return at::kFloat;
  }
}

// `in` (dtype from) converted by LibTorch into dtype `to`, as raw elements of type Out.
template <typename Out, typename In>
std::vector<Out> TorchCast(DType from, DType to, std::vector<In> in) {
  at::set_num_threads(1);
  const at::Tensor src =
      at::from_blob(in.data(), {static_cast<int64_t>(in.size())}, TorchType(from));
  const at::Tensor dst = src.to(TorchType(to)).contiguous();
  REQUIRE(static_cast<size_t>(dst.element_size()) == sizeof(Out));
  std::vector<Out> out(in.size());
  std::memcpy(out.data(), dst.data_ptr(), in.size() * sizeof(Out));
  return out;
}

bool IsNaN(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kF32:
      return (bits & 0x7FFFFFFFu) > 0x7F800000u;
    case DType::kF16:
      return (bits & 0x7FFFu) > 0x7C00u;
    case DType::kBF16:
      return (bits & 0x7FFFu) > 0x7F80u;
    default:
      return false;
  }
}

// Compares loadstone and LibTorch on `in` for from -> to. Bits must match, except that for a
// bf16 NaN (see the top of the file), and an f32 NaN from f64, only NaN-ness must.
template <typename Out, typename In>
void Compare(DType from, DType to, const std::vector<In>& in) {
  const auto ours = Cast<Out>(from, to, in);
  const auto torch = TorchCast<Out>(from, to, in);
  size_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool nan_only = IsNaN(to, torch[i]) && (to == DType::kBF16 || from == DType::kF64);
    const bool ok = nan_only ? IsNaN(to, ours[i]) : ours[i] == torch[i];
    if (!ok && bad++ < 5) {
      FAIL_CHECK(TorchName(from) << " " << Hex(in[i]) << " -> " << TorchName(to) << ": ours "
                                 << Hex(ours[i]) << ", torch " << Hex(torch[i]));
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("LibTorch: every f16 and bf16 code to the other two", "[convert][torch]") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  Compare<uint32_t>(DType::kF16, DType::kF32, all);
  Compare<uint16_t>(DType::kF16, DType::kBF16, all);
  Compare<uint32_t>(DType::kBF16, DType::kF32, all);
  Compare<uint16_t>(DType::kBF16, DType::kF16, all);
}

TEST_CASE("LibTorch: f32 -> f16 / bf16 on edge cases and a random sweep", "[convert][torch]") {
  std::vector<uint32_t> in = {
      0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7F7FFFFFu, 0x7F7F8000u, 0x477FF000u, Bits(65519.99f),
      0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x00008000u, 0x33000000u, 0x33000001u,
      0x387FC000u, 0x38800000u, 0x00000001u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu};
  // Every bf16/f16 boundary: c << 16 | 0x8000 is the bf16 midpoint above code c; the f16
  // midpoints are covered by sweeping the 13 dropped bits near them.
  for (uint32_t c = 0; c < 65536; ++c) {
    in.push_back(c << 16 | 0x8000u);
    in.push_back(c << 16 | 0x7FFFu);
  }
  std::mt19937_64 rng(TestSeed("torch f32 sweep"));
  for (int i = 0; i < (1 << 21); ++i) {
    in.push_back(static_cast<uint32_t>(rng()));
    // Bits that put the value inside the f16 range, with a midpoint-heavy low part.
    const uint32_t exp = 0x33u + static_cast<uint32_t>(rng() % 0x15u);
    const uint32_t low = (rng() & 1) ? 0x1000u : static_cast<uint32_t>(rng() & 0x1FFFu);
    in.push_back((static_cast<uint32_t>(rng()) & 0x807FE000u) | exp << 23 | low);
  }
  Compare<uint16_t>(DType::kF32, DType::kF16, in);
  Compare<uint16_t>(DType::kF32, DType::kBF16, in);
}

TEST_CASE("LibTorch: f64 -> f32 / f16 / bf16, double rounding included", "[convert][torch]") {
  std::vector<uint64_t> in;
  for (double d : {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
                   1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 65519.99999, 65520.0, 1e300,
                   -1e300, 1e-300, std::ldexp(1.0, -149), 3.0e38, 3.5e38}) {
    in.push_back(std::bit_cast<uint64_t>(d));
  }
  std::mt19937_64 rng(TestSeed("torch f64 sweep"));
  for (int i = 0; i < (1 << 20); ++i) {
    in.push_back(rng());
    // Near-ties: an f32-exact value plus a tiny offset, so the two roundings can differ.
    const auto base = static_cast<double>(
        F32((static_cast<uint32_t>(rng()) & 0x81FFFFFFu) | 0x38000000u | (rng() % 32) << 23));
    in.push_back(
        std::bit_cast<uint64_t>(base + std::ldexp(base, -30 - static_cast<int>(rng() % 8))));
  }
  Compare<uint32_t>(DType::kF64, DType::kF32, in);
  Compare<uint16_t>(DType::kF64, DType::kF16, in);
  Compare<uint16_t>(DType::kF64, DType::kBF16, in);
}

}  // namespace
}  // namespace loadstone::convert
