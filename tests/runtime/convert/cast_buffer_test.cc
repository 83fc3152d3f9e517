// CastBuffer as a buffer operation: which pairs convert, counts, alignment, overlap, guard
// bytes, f64 sources (rounded through f32, as PyTorch does), and concurrent use.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "cast_testing.h"
#include "runtime/convert/cast.h"

namespace loadstone::convert {
namespace {

using namespace testing;  // NOLINT(build/namespaces)

const DType kSources[] = {DType::kF32, DType::kF16,    DType::kBF16,
                          DType::kF64, DType::kF8E4M3, DType::kF8E5M2};
const DType kTargets[] = {DType::kF32, DType::kF16, DType::kBF16};

std::vector<std::pair<DType, DType>> ConvertingPairs() {
  std::vector<std::pair<DType, DType>> pairs;
  for (DType from : kSources) {
    for (DType to : kTargets) {
      if (from != to) pairs.emplace_back(from, to);
    }
  }
  return pairs;
}

// Random bytes, so every bit pattern (NaN, subnormal, ...) of the source shows up.
std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST_CASE("CanCast: float sources to f32/f16/bf16, identity for all, nothing else", "[convert]") {
  std::set<std::pair<DType, DType>> want;
  for (const auto& p : ConvertingPairs()) want.insert(p);
  std::byte src[16] = {};
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      const auto from = static_cast<DType>(i);
      const auto to = static_cast<DType>(j);
      const bool expected = from == to || want.count({from, to}) == 1;
      INFO(TorchName(from) << " -> " << TorchName(to));
      CHECK(CanCast(from, to) == expected);
      std::byte dst[16];
      std::memset(dst, 0xAB, sizeof(dst));
      const Status s = CastBuffer(from, to, src, dst, 1);
      CHECK(s.ok() == expected);
      if (!expected) {
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK(s.message().find(TorchName(from)) != std::string_view::npos);
        CHECK(s.message().find(TorchName(to)) != std::string_view::npos);
        for (std::byte b : dst) CHECK(b == std::byte{0xAB});  // nothing written
      }
    }
  }
  // The policy's exclusions, spelled out.
  CHECK_FALSE(CanCast(DType::kI32, DType::kF32));
  CHECK_FALSE(CanCast(DType::kBool, DType::kBF16));
  CHECK_FALSE(CanCast(DType::kU8, DType::kF16));
  CHECK_FALSE(CanCast(DType::kF32, DType::kF8E4M3));
  CHECK_FALSE(CanCast(DType::kF8E4M3FNUZ, DType::kF32));
  CHECK_FALSE(CanCast(DType::kC64, DType::kF32));
}

TEST_CASE("zero counts write nothing and accept null pointers", "[convert]") {
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      const auto from = static_cast<DType>(i);
      const auto to = static_cast<DType>(j);
      if (!CanCast(from, to)) continue;
      CHECK(CastBuffer(from, to, nullptr, nullptr, 0).ok());
    }
  }
  CastF32ToF8E4M3(nullptr, nullptr, 0);
}

TEST_CASE("every count and misalignment gives the same elements, touching only dst", "[convert]") {
  constexpr size_t kMaxCount = 67;  // odd, and past a few vector widths
  constexpr size_t kGuard = 16;
  for (const auto& [from, to] : ConvertingPairs()) {
    const size_t in_size = ElementBytes(from, 1);
    const size_t out_size = ElementBytes(to, 1);
    const auto src = RandomBytes(in_size * kMaxCount + 8, 42);
    // The whole buffer, aligned: what each element must be.
    std::vector<std::byte> want(out_size * kMaxCount);
    REQUIRE(CastBuffer(from, to, src.data(), want.data(), kMaxCount).ok());
    std::vector<std::byte> dst(out_size * kMaxCount + 2 * kGuard + 8);
    for (size_t count = 0; count <= kMaxCount; ++count) {
      for (size_t src_off = 0; src_off < 8; ++src_off) {
        for (size_t dst_off = 0; dst_off < 8; ++dst_off) {
          INFO(TorchName(from) << " -> " << TorchName(to) << ", count " << count << ", src+"
                               << src_off << ", dst+" << dst_off);
          std::vector<std::byte> moved(src.begin(), src.end());
          std::memmove(moved.data() + src_off, src.data(), in_size * kMaxCount);
          std::memset(dst.data(), 0x5A, dst.size());
          std::byte* out = dst.data() + kGuard + dst_off;
          REQUIRE(CastBuffer(from, to, moved.data() + src_off, out, count).ok());
          REQUIRE(std::memcmp(out, want.data(), out_size * count) == 0);
          for (size_t k = 0; k < dst.size(); ++k) {
            const bool inside = k >= kGuard + dst_off && k < kGuard + dst_off + out_size * count;
            if (!inside && dst[k] != std::byte{0x5A}) FAIL("wrote outside dst at " << k);
          }
        }
      }
    }
  }
}

TEST_CASE("identity copies any dtype, packed ones by their rounded-up bytes", "[convert]") {
  const auto src = RandomBytes(64, 7);
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto dtype = static_cast<DType>(i);
    std::vector<std::byte> dst(80, std::byte{0x11});
    REQUIRE(CastBuffer(dtype, dtype, src.data(), dst.data(), 5).ok());
    const uint64_t bytes = ElementBytes(dtype, 5);
    INFO(TorchName(dtype) << ": " << bytes << " bytes");
    CHECK(std::memcmp(dst.data(), src.data(), bytes) == 0);
    CHECK(dst[bytes] == std::byte{0x11});
  }
  CHECK(ElementBytes(DType::kF4, 5) == 3);
  CHECK(ElementBytes(DType::kF6E2M3, 5) == 4);  // 30 bits
  CHECK(ElementBytes(DType::kF64, 5) == 40);
  // Identity allows overlap (memmove).
  std::vector<std::byte> buf(src.begin(), src.end());
  REQUIRE(CastBuffer(DType::kF32, DType::kF32, buf.data(), buf.data() + 4, 8).ok());
  CHECK(std::memcmp(buf.data() + 4, src.data(), 32) == 0);
}

TEST_CASE("f64 rounds to f32 first, then to f16 / bf16, as PyTorch does", "[convert]") {
  struct Case {
    double in;
    uint32_t f32;
    uint16_t f16;
    uint16_t bf16;
  };
  const double tiny = std::ldexp(1.0, -40);
  const Case cases[] = {
      // 1 + 2^-11 + 2^-40 is nearer 0x3C01, but as an f32 it is the tie 1 + 2^-11 -> 0x3C00.
      // LibTorch 1.13 gives 0x3C00 (checked in cast_torch_test.cc).
      {1.0 + std::ldexp(1.0, -11) + tiny, 0x3F801000u, 0x3C00, 0x3F80},
      // The same for bf16: 1 + 2^-8 + 2^-40 -> f32 tie 1 + 2^-8 -> 0x3F80 (not 0x3F81).
      {1.0 + std::ldexp(1.0, -8) + tiny, 0x3F808000u, 0x3C04, 0x3F80},
      // 65519.99999 is an f32 65520 (the f16 overflow threshold): inf, not 65504.
      {65519.99999, 0x477FF000u, 0x7C00, 0x4780},
      {1.0, 0x3F800000u, 0x3C00, 0x3F80},
      {-2.5, 0xC0200000u, 0xC100, 0xC020},
      {1e300, 0x7F800000u, 0x7C00, 0x7F80},
      {-1e300, 0xFF800000u, 0xFC00, 0xFF80},
      {1e-300, 0x00000000u, 0x0000, 0x0000},
      {-1e-300, 0x80000000u, 0x8000, 0x8000},
      {INFINITY, 0x7F800000u, 0x7C00, 0x7F80},
      {std::ldexp(1.0, -149), 0x00000001u, 0x0000, 0x0000},  // the smallest f32 subnormal
  };
  std::vector<uint64_t> in;
  for (const Case& c : cases) in.push_back(std::bit_cast<uint64_t>(c.in));
  in.push_back(0x7FF8000000000000u);  // NaN
  in.push_back(0xFFF0000000000001u);  // negative signalling NaN
  const auto f32 = Cast<uint32_t>(DType::kF64, DType::kF32, in);
  const auto f16 = Cast<uint16_t>(DType::kF64, DType::kF16, in);
  const auto bf16 = Cast<uint16_t>(DType::kF64, DType::kBF16, in);
  for (size_t i = 0; i < std::size(cases); ++i) {
    INFO("f64 " << cases[i].in);
    CHECK(f32[i] == cases[i].f32);
    CHECK(f16[i] == cases[i].f16);
    CHECK(bf16[i] == cases[i].bf16);
  }
  const size_t n = std::size(cases);
  CHECK(std::isnan(F32(f32[n])));
  CHECK(std::isnan(F32(f32[n + 1])));
  CHECK(f16[n] == 0x7E00);
  CHECK(f16[n + 1] == 0xFE00);
  CHECK(bf16[n] == 0x7FC0);
  CHECK(bf16[n + 1] == 0x7FC0);
}

TEST_CASE("random f64 sweep: f32 by the hardware, then the f32 reference", "[convert]") {
  std::mt19937_64 rng(TestSeed("f64 sweep"));
  std::vector<uint64_t> in(1 << 18);
  for (size_t i = 0; i < in.size(); i += 2) {
    in[i] = rng();
    const auto e = static_cast<int>(rng() % 300) - 150;
    in[i + 1] = std::bit_cast<uint64_t>(std::ldexp(static_cast<double>(rng() >> 11), e - 53)) |
                (rng() & 0x8000000000000000u);
  }
  const auto f32 = Cast<uint32_t>(DType::kF64, DType::kF32, in);
  const auto f16 = Cast<uint16_t>(DType::kF64, DType::kF16, in);
  const auto bf16 = Cast<uint16_t>(DType::kF64, DType::kBF16, in);
  size_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const double d = std::bit_cast<double>(in[i]);
    const uint32_t want32 = Bits(static_cast<float>(d));
    const bool ok = (std::isnan(d) ? std::isnan(F32(f32[i])) : f32[i] == want32) &&
                    f16[i] == RefF32ToF16(want32) && bf16[i] == RefF32ToBF16(want32);
    if (!ok && bad++ < 5) FAIL_CHECK("f64 " << Hex(in[i]));
  }
  CHECK(bad == 0);
}

TEST_CASE("concurrent casts from several threads give the single-thread result", "[convert]") {
  constexpr size_t kCount = (4 << 20) / 4 + 3;  // 4 MiB of f32, odd
  const auto src = RandomBytes(kCount * 4, 99);
  std::vector<std::byte> want(kCount * 2);
  REQUIRE(CastBuffer(DType::kF32, DType::kBF16, src.data(), want.data(), kCount).ok());
  constexpr int kThreads = 4;
  std::vector<std::vector<std::byte>> outs(kThreads, std::vector<std::byte>(kCount * 2));
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 4; ++rep) {
        ok[t] += CastBuffer(DType::kF32, DType::kBF16, src.data(), outs[t].data(), kCount).ok();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(ok[t] == 4);
    CHECK(outs[t] == want);
  }
}

}  // namespace
}  // namespace loadstone::convert
