// Every cast kernel against runtime/convert's CPU reference, bit for bit: exhaustive over
// 8- and 16-bit sources, structured + random over f32 and f64; aligned (vector path), shifted
// by one element (scalar path) and by one byte (unaligned path), with tails.
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cast_kernels.h"
#include "cuda/cuda_handles.h"
#include "gpu_test_util.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::cuda {
namespace {

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<std::byte> Inputs(DType from, uint64_t seed) {
  std::mt19937_64 rng(seed);
  switch (from) {
    case DType::kF8E4M3:
    case DType::kF8E5M2: {
      std::vector<uint8_t> v;
      for (int r = 0; r < 67; ++r)
        for (int c = 0; c < 256; ++c) v.push_back(static_cast<uint8_t>(c + r));
      for (int c = 0; c < 5; ++c) v.push_back(static_cast<uint8_t>(0x7F + c));  // a tail
      return Bytes(v);
    }
    case DType::kF16:
    case DType::kBF16: {
      std::vector<uint16_t> v;
      for (uint32_t c = 0; c < 65536; ++c) v.push_back(static_cast<uint16_t>(c));
      for (int c = 0; c < 7; ++c) v.push_back(static_cast<uint16_t>(0x7C00 + c));
      return Bytes(v);
    }
    case DType::kF32: {
      // Every sign/exponent/top-7-mantissa pattern with low halves at the rounding edges of
      // bf16 (bit 16) and f16 (bit 13, and subnormal steps), then random patterns.
      const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000,
                               0x2001, 0x3000, 0x5FFF, 0x6000, 0x7FFF, 0x8000, 0x8001,
                               0x9000, 0xBFFF, 0xC000, 0xE000, 0xF000, 0xFFFF};
      std::vector<uint32_t> v;
      for (uint32_t hi = 0; hi < 65536; ++hi)
        for (uint32_t lo : lows) v.push_back(hi << 16 | lo);
      for (int i = 0; i < (1 << 22) + 3; ++i) v.push_back(static_cast<uint32_t>(rng()));
      return Bytes(v);
    }
    case DType::kF64: {
      std::vector<uint64_t> v = {0, 0x8000000000000000ull, 0x7FF0000000000000ull,
                                 0xFFF0000000000000ull, 0x7FF8000000000000ull, 1,
                                 0x47EFFFFFF0000000ull, 0x47EFFFFFE0000000ull};
      for (int i = 0; i < (1 << 20); ++i) v.push_back(rng());
      // Doubles near f32 values, with the 29 dropped bits at and around the tie.
      const uint64_t drops[] = {0, 1, 0x0FFFFFFF, 0x10000000, 0x10000001, 0x1FFFFFFF};
      for (int i = 0; i < (1 << 18); ++i) {
        const double d = static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(rng())));
        uint64_t bits = std::bit_cast<uint64_t>(d);
        bits = (bits & ~0x1FFFFFFFull) | drops[i % 6];
        v.push_back(bits);
      }
      return Bytes(v);
    }
    default:
      return {};
  }
}

// Casts on the GPU at byte offsets (src_shift, dst_shift) and compares with CastBuffer.
void CheckPair(DType from, DType to, const std::vector<std::byte>& in, uint64_t src_shift,
               uint64_t dst_shift) {
  const uint64_t in_size = convert::ElementBytes(from, 1);
  const uint64_t count = in.size() / in_size;
  const uint64_t out_bytes = convert::ElementBytes(to, count);
  std::vector<std::byte> expect(out_bytes);
  REQUIRE(convert::CastBuffer(from, to, in.data(), expect.data(), count).ok());

  auto src = DeviceBuffer::Allocate(0, in.size() + 64);
  auto dst = DeviceBuffer::Allocate(0, out_bytes + 64);
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  std::byte* s = src->data() + src_shift;
  std::byte* d = dst->data() + dst_shift;
  REQUIRE(cudaMemcpy(s, in.data(), in.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(dst->data(), 0xA5, out_bytes + 64) == cudaSuccess);
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  const Status launched =
      LaunchCast(from, to, s, d, count, nullptr, static_cast<uint32_t>(prop.multiProcessorCount), 0);
  REQUIRE(launched.ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<std::byte> got(out_bytes + 64);
  REQUIRE(cudaMemcpy(got.data(), dst->data(), got.size(), cudaMemcpyDeviceToHost) == cudaSuccess);

  // Bytes around the output stay untouched.
  for (uint64_t i = 0; i < dst_shift; ++i) REQUIRE(got[i] == std::byte{0xA5});
  REQUIRE(got[dst_shift + out_bytes] == std::byte{0xA5});
  const std::byte* out = got.data() + dst_shift;
  if (std::memcmp(out, expect.data(), out_bytes) != 0) {
    const uint64_t out_size = convert::ElementBytes(to, 1);
    for (uint64_t i = 0; i < count; ++i) {
      if (std::memcmp(out + i * out_size, expect.data() + i * out_size, out_size) != 0) {
        uint64_t x = 0, e = 0, g = 0;
        std::memcpy(&x, in.data() + i * in_size, in_size);
        std::memcpy(&e, expect.data() + i * out_size, out_size);
        std::memcpy(&g, out + i * out_size, out_size);
        FAIL(TorchName(from) << "->" << TorchName(to) << " shift " << src_shift << "/"
                             << dst_shift << ": element " << i << " input 0x" << std::hex << x
                             << " expected 0x" << e << " got 0x" << g);
      }
    }
  }
}

TEST_CASE("cast kernels: bit-exact with the CPU reference, every pair, every path") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  const DType sources[] = {DType::kF32, DType::kF16, DType::kBF16,
                           DType::kF64, DType::kF8E4M3, DType::kF8E5M2};
  const DType targets[] = {DType::kF32, DType::kF16, DType::kBF16};
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  for (DType from : sources) {
    const auto in = Inputs(from, seed);
    for (DType to : targets) {
      if (from == to) continue;
      INFO(TorchName(from) << " -> " << TorchName(to));
      REQUIRE(CanCastOnDevice(from, to));
      const uint64_t in_size = convert::ElementBytes(from, 1);
      const uint64_t out_size = convert::ElementBytes(to, 1);
      CheckPair(from, to, in, 0, 0);                // vector path + tail
      CheckPair(from, to, in, in_size, out_size);   // element-aligned: scalar path
      CheckPair(from, to, in, 0, 1);                // unaligned destination: byte path
    }
  }
}

TEST_CASE("fp8 block dequant kernel: bit-exact with the CPU reference, ragged, in pieces") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const uint64_t rows = 1000, cols = 520;  // 8 x 5 blocks of 128, the last ones partial
  const uint64_t scale_cols = (cols + 127) / 128;
  std::vector<uint8_t> codes(rows * cols);
  for (uint64_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i % 256 ^ rng() % 7);
  std::vector<float> scales(8 * scale_cols);
  for (float& x : scales) {
    const auto exponent = -static_cast<int>(rng() % 30);
    x = std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, exponent);
  }
  scales[3] = 1e-38f;  // subnormal products
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  auto d_codes = DeviceBuffer::Allocate(0, codes.size());
  auto d_scales = DeviceBuffer::Allocate(0, scales.size() * 4);
  auto d_out = DeviceBuffer::Allocate(0, codes.size() * 4 + 8);
  REQUIRE(d_codes.ok());
  REQUIRE(d_scales.ok());
  REQUIRE(d_out.ok());
  REQUIRE(cudaMemcpy(d_codes->data(), codes.data(), codes.size(), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  // f32 scales (DeepSeek), bf16 and f16 ones (compressed-tensors: the product rounds in them).
  for (DType scale_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const uint64_t scale_bytes = scale_dtype == DType::kF32 ? 4 : 2;
    std::vector<std::byte> stored(scales.size() * scale_bytes);
    for (size_t i = 0; i < scales.size(); ++i) {
      const uint32_t f = std::bit_cast<uint32_t>(scales[i]);
      const uint32_t raw = scale_dtype == DType::kBF16  ? convert::F32ToBF16Bits(f)
                           : scale_dtype == DType::kF16 ? convert::F32ToF16Bits(f)
                                                        : f;
      std::memcpy(stored.data() + i * scale_bytes, &raw, scale_bytes);
    }
    REQUIRE(cudaMemcpy(d_scales->data(), stored.data(), stored.size(), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    const convert::Fp8BlockScales host_layout{stored.data(), cols, 128, 128, scale_cols,
                                              scale_dtype};
    convert::Fp8BlockScales device_layout = host_layout;
    device_layout.scales = d_scales->data();
    for (DType from : {DType::kF8E4M3, DType::kF8E5M2}) {
      for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
        INFO(TorchName(from) << " -> " << TorchName(to) << ", " << TorchName(scale_dtype)
                             << " scales");
        REQUIRE(CanDequantFp8BlockOnDevice(from, to));
        // The whole weight, and a piece that starts mid-row, mid-block (odd addresses).
        for (auto [first, count] :
             {std::pair<uint64_t, uint64_t>{0, rows * cols}, {777, 99'001}}) {
          const uint64_t out_size = convert::ElementBytes(to, 1);
          std::vector<std::byte> expect(count * out_size), got(count * out_size);
          const auto* host_codes = reinterpret_cast<const std::byte*>(codes.data());
          REQUIRE(convert::DequantFp8Block(from, to, host_codes + first, expect.data(), first,
                                           count, host_layout)
                      .ok());
          REQUIRE(LaunchDequantFp8Block(from, to, d_codes->data() + first, d_out->data() + 1,
                                        first, count, device_layout, nullptr,
                                        static_cast<uint32_t>(prop.multiProcessorCount), 0)
                      .ok());
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
          REQUIRE(cudaMemcpy(got.data(), d_out->data() + 1, got.size(),
                             cudaMemcpyDeviceToHost) == cudaSuccess);
          CHECK(got == expect);
        }
      }
    }
  }
  CHECK_FALSE(CanDequantFp8BlockOnDevice(DType::kF16, DType::kF32));
}

}  // namespace
}  // namespace loadstone::cuda
