// Single-thread throughput of CastBuffer, in GB/s of input, on buffers the size of a
// pipeline chunk (default 8 MiB of input per call).
//
//   cmake --build build --target cast_bench && build/bench/cast_bench [MIB] [SECONDS_PER_CASE]
//
// Two destinations per case: "hot" writes the same buffer every call (it stays in the caches
// when it fits); "fill" walks a 1 GiB arena the way the loader fills a large tensor chunk by
// chunk, so every written line is new to the caches.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "loadstone/dtype.h"
#include "runtime/convert/cast.h"

namespace {

using loadstone::DType;
using Clock = std::chrono::steady_clock;

// Inputs are finite values of the kind weights hold (|x| ~ N(0, 0.05)), written as the source
// dtype, so that no case runs on an unusual fast path.
std::vector<std::byte> MakeInput(DType dtype, uint64_t count) {
  std::vector<float> values(count);
  std::mt19937 rng(1234);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  for (float& v : values) v = dist(rng);
  std::vector<std::byte> out(loadstone::convert::ElementBytes(dtype, count));
  if (dtype == DType::kF32) {
    std::memcpy(out.data(), values.data(), out.size());
  } else if (dtype == DType::kF8E4M3) {
    loadstone::convert::CastF32ToF8E4M3(reinterpret_cast<const std::byte*>(values.data()),
                                        out.data(), count);
  } else if (dtype == DType::kF64) {
    for (uint64_t i = 0; i < count; ++i) {
      const double d = values[i];
      std::memcpy(out.data() + 8 * i, &d, 8);
    }
  } else if (dtype == DType::kF8E5M2) {  // the top byte of the f16 (truncated; fine here)
    std::vector<std::byte> half(2 * count);
    if (!loadstone::convert::CastBuffer(DType::kF32, DType::kF16,
                                        reinterpret_cast<const std::byte*>(values.data()),
                                        half.data(), count)
             .ok()) {
      std::abort();
    }
    for (uint64_t i = 0; i < count; ++i) out[i] = half[2 * i + 1];
  } else {
    const loadstone::Status s = loadstone::convert::CastBuffer(
        DType::kF32, dtype, reinterpret_cast<const std::byte*>(values.data()), out.data(), count);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::abort();
    }
  }
  return out;
}

// Times CastBuffer on `in_bytes` of input, into the start of `arena` ("hot") and walking
// through it ("fill").
void Run(DType from, DType to, uint64_t in_bytes, double seconds, std::vector<std::byte>& arena) {
  const uint64_t count = in_bytes / loadstone::convert::ElementBytes(from, 1);
  const std::vector<std::byte> src = MakeInput(from, count);
  const uint64_t out_bytes = loadstone::convert::ElementBytes(to, count);
  const uint64_t arena_bytes = arena.size();
  double best[2] = {1e30, 1e30};
  int reps = 0;
  for (int fill = 0; fill < 2; ++fill) {
    uint64_t offset = 0;
    const auto start = Clock::now();
    for (int i = 0;
         i < 3 || std::chrono::duration<double>(Clock::now() - start).count() < seconds / 2;
         ++i, ++reps) {
      std::byte* dst = arena.data();
      if (fill == 1) {
        offset = offset + out_bytes > arena_bytes ? 0 : offset;
        dst += offset;
        offset += (out_bytes + 63) / 64 * 64;
      }
      const auto t0 = Clock::now();
      const loadstone::Status s = loadstone::convert::CastBuffer(from, to, src.data(), dst, count);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!s.ok()) std::abort();
      best[fill] = std::min(best[fill], dt);
    }
  }
  const auto gbps = [&](double t) { return static_cast<double>(src.size()) / t / 1e9; };
  std::printf("%-14s -> %-9s %7.2f GB/s hot  %7.2f GB/s fill   (GB/s of input; %d calls)\n",
              std::string(loadstone::TorchName(from)).c_str(),
              std::string(loadstone::TorchName(to)).c_str(), gbps(best[0]), gbps(best[1]), reps);
}

}  // namespace

int main(int argc, char** argv) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 8.0;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  const auto in_bytes = static_cast<uint64_t>(mib * 1024 * 1024);
  std::printf("input %.1f MiB per call, single thread, best of >= %.1f s per case\n", mib, seconds);
  const std::pair<DType, DType> cases[] = {
      {DType::kBF16, DType::kF32},    {DType::kF32, DType::kBF16},    {DType::kF16, DType::kF32},
      {DType::kF32, DType::kF16},     {DType::kF8E4M3, DType::kBF16}, {DType::kF8E4M3, DType::kF32},
      {DType::kF8E5M2, DType::kBF16}, {DType::kF16, DType::kBF16},    {DType::kBF16, DType::kF16},
      {DType::kF64, DType::kF32},     {DType::kF64, DType::kBF16},    {DType::kF32, DType::kF32},
  };
  // At least 1 GiB and two outputs of the widest case (f8 -> f32: 4x the input); touched
  // here, so that no page fault is timed.
  std::vector<std::byte> arena(std::max<uint64_t>(uint64_t{1} << 30, 8 * in_bytes), std::byte{1});
  for (const auto& [from, to] : cases) Run(from, to, in_bytes, seconds, arena);
  return 0;
}
