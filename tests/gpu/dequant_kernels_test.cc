// The dequant kernels against runtime/convert's CPU references (DequantPackedInt, DequantBnb4,
// DequantBnbInt8), bit for bit, on random codes, zeros, g_idx and scales: every packing order
// and width, bitsandbytes NF4/FP4 plain and nested, LLM.int8; whole tensors and a range that
// starts mid-row (and, for 4-bit bitsandbytes, at a low nibble), into each target dtype.
// Skips without a CUDA device.
#include "cuda/dequant_kernels.h"

#include <cuda_runtime.h>

#include <bit>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_handles.h"
#include "gpu_test_util.h"
#include "io/formats/bnb_state.h"
#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/convert/packed_int.h"

namespace loadstone::cuda {
namespace {

std::vector<std::byte> RandomBytes(uint64_t n, std::mt19937_64& rng) {
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

// Float scales of `dtype`: positive, finite, varied exponents.
std::vector<std::byte> RandomScales(uint64_t n, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(1e-4f, 2.0f);
  std::vector<std::byte> b(n * (DTypeBits(dtype) / 8));
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t f = std::bit_cast<uint32_t>(value(rng));
    if (dtype == DType::kF32) {
      std::memcpy(b.data() + 4 * i, &f, 4);
    } else {  // truncated: any bits of the dtype will do as a scale
      const uint16_t h = dtype == DType::kBF16 ? static_cast<uint16_t>(f >> 16)
                                               : static_cast<uint16_t>(0x3000 + (f >> 20) % 0x1000);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

uint32_t SmCount() {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  return static_cast<uint32_t>(prop.multiProcessorCount);
}

// Device copies of host vectors, alive as long as this is.
class Uploads {
 public:
  template <typename T>
  const T* Put(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    auto buffer = DeviceBuffer::Allocate(0, v.size() * sizeof(T));
    REQUIRE(buffer.ok());
    REQUIRE(cudaMemcpy(buffer->data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    buffers_.push_back(std::make_unique<DeviceBuffer>(std::move(*buffer)));
    return reinterpret_cast<const T*>(buffers_.back()->data());
  }
  std::byte* Output(uint64_t bytes) {
    auto buffer = DeviceBuffer::Allocate(0, bytes);
    REQUIRE(buffer.ok());
    REQUIRE(cudaMemset(buffer->data(), 0xA5, bytes) == cudaSuccess);
    buffers_.push_back(std::make_unique<DeviceBuffer>(std::move(*buffer)));
    return buffers_.back()->data();
  }

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

std::vector<std::byte> Fetch(const std::byte* device, uint64_t bytes) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<std::byte> host(bytes);
  REQUIRE(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

TEST_CASE("dequant kernels: packed integers, every order and width, as the CPU decodes", "[gpu]") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  struct Case {
    PackOrder order;
    uint32_t bits;
    bool g_idx, zeros;
    DType scale_dtype;
  };
  const Case cases[] = {
      {PackOrder::kRows, 2, false, false, DType::kF32},
      {PackOrder::kRows, 4, true, true, DType::kBF16},
      {PackOrder::kRows, 8, false, true, DType::kF16},
      {PackOrder::kGptq, 2, false, true, DType::kF16},
      {PackOrder::kGptq, 3, false, true, DType::kF16},
      {PackOrder::kGptq, 4, true, true, DType::kF16},
      {PackOrder::kGptq, 8, false, true, DType::kBF16},
      {PackOrder::kAwq, 4, false, true, DType::kF16},
  };
  std::mt19937_64 rng(23);
  for (const Case& c : cases) {
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO("order " << static_cast<int>(c.order) << ", bits " << c.bits << ", to "
                    << TorchName(to));
      PackedIntState s;
      s.order = c.order;
      s.bits = c.bits;
      s.rows = 96;
      s.cols = c.order == PackOrder::kRows ? 200 : 256;
      s.groups = 4;
      s.group_size = (s.cols + s.groups - 1) / s.groups;
      s.scale_dtype = c.scale_dtype;
      if (c.zeros) {
        for (uint64_t i = 0; i < s.rows * s.groups; ++i) {
          s.zeros.push_back(static_cast<int16_t>(rng() % (1u << c.bits)));
        }
      }
      if (c.g_idx) {
        for (uint64_t i = 0; i < s.cols; ++i) s.g_idx.push_back(static_cast<int32_t>(rng() % 4));
      }
      const std::vector<std::byte> words = RandomBytes(s.words() * 4, rng);
      const std::vector<std::byte> scales = RandomScales(s.rows * s.groups, c.scale_dtype, rng);
      const uint64_t out_elem = DTypeBits(to) / 8, n = s.rows * s.cols;
      // The whole weight, then (row-ordered packing only) a range from mid-row with its words.
      const uint64_t first = c.order == PackOrder::kRows ? 3 * s.cols + 17 : 0;
      for (const uint64_t start : {uint64_t{0}, first}) {
        const uint64_t first_word = convert::WordOf(s, start);
        std::vector<std::byte> want((n - start) * out_elem);
        REQUIRE(convert::DequantPackedInt(s, to, words.data() + 4 * first_word, first_word, start,
                                          n - start, scales.data(), want.data())
                    .ok());
        Uploads up;
        const DevicePackedInt d = DeviceStateOf(s, up.Put(s.zeros), up.Put(s.g_idx));
        const std::vector<std::byte> tail(words.begin() + 4 * first_word, words.end());
        std::byte* out = up.Output(want.size());
        REQUIRE(LaunchDequantPackedInt(d, to, up.Put(tail), first_word, start, n - start,
                                       up.Put(scales), out, nullptr, SmCount(), 0)
                    .ok());
        CHECK(Fetch(out, want.size()) == want);
      }
    }
  }
}

TEST_CASE("dequant kernels: bitsandbytes NF4/FP4 (plain, nested) and LLM.int8, as the CPU",
          "[gpu]") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const bool fp4 : {false, true}) {
    for (const bool nested : {false, true}) {
      for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
        INFO((fp4 ? "fp4" : "nf4") << (nested ? ", nested" : "") << ", to " << TorchName(to));
        const uint64_t n = 64 * 100 + 37, blocksize = 64, blocks = (n + blocksize - 1) / 64;
        auto state = std::make_shared<Bnb4State>();
        state->fp4 = fp4;
        for (int k = 0; k < 16; ++k) {
          state->code[k] = fp4 ? (k < 8 ? io::Fp4Magnitudes()[k] : 0.0f) : io::Nf4Code()[k];
        }
        state->nested = nested;
        std::vector<std::byte> absmax;
        if (nested) {
          state->nested_blocksize = 32;
          state->nested_offset = value(rng);
          for (auto& x : state->nested_code) x = value(rng);
          for (uint64_t b = 0; b < (blocks + 31) / 32; ++b)
            state->nested_absmax.push_back(value(rng));
          absmax = RandomBytes(blocks, rng);
        } else {
          absmax = RandomScales(blocks, DType::kF32, rng);
        }
        PackedLayout layout;
        layout.scheme = fp4 ? "bnb-fp4" : "bnb-nf4";
        layout.element_shape = {n};
        layout.block_elems = static_cast<uint32_t>(blocksize);
        layout.bnb4 = state;
        const std::vector<std::byte> packed = RandomBytes((n + 1) / 2, rng);
        const uint64_t out_elem = DTypeBits(to) / 8;
        for (const uint64_t first : {uint64_t{0}, uint64_t{77}}) {  // 77: a low nibble first
          std::vector<std::byte> want((n - first) * out_elem);
          REQUIRE(convert::DequantBnb4(layout, to, packed.data() + first / 2, first, n - first,
                                       absmax.data(), want.data())
                      .ok());
          Uploads up;
          const DeviceBnb4 d = DeviceStateOf(
              layout,
              up.Put(std::vector<float>(state->nested_code.begin(), state->nested_code.end())),
              up.Put(state->nested_absmax));
          const std::vector<std::byte> tail(packed.begin() + first / 2, packed.end());
          std::byte* out = up.Output(want.size());
          REQUIRE(LaunchDequantBnb4(d, to, up.Put(tail), first, n - first, up.Put(absmax), out,
                                    nullptr, SmCount(), 0)
                      .ok());
          CHECK(Fetch(out, want.size()) == want);
        }
      }
    }
  }
  for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
    INFO("int8 to " << TorchName(to));
    const uint64_t rows = 40, cols = 130, first = 2 * cols + 5, count = rows * cols - first;
    const std::vector<std::byte> codes = RandomBytes(rows * cols, rng);
    const std::vector<std::byte> scb = RandomScales(rows, DType::kF32, rng);
    std::vector<std::byte> want(count * (DTypeBits(to) / 8));
    REQUIRE(convert::DequantBnbInt8(to, codes.data() + first, first, count, cols, scb.data(),
                                    want.data())
                .ok());
    Uploads up;
    const std::vector<std::byte> tail(codes.begin() + first, codes.end());
    std::byte* out = up.Output(want.size());
    REQUIRE(LaunchDequantBnbInt8(to, up.Put(tail), first, count, cols, up.Put(scb), out, nullptr,
                                 SmCount(), 0)
                .ok());
    CHECK(Fetch(out, want.size()) == want);
  }
}

TEST_CASE("dequant kernels: every GGUF block type, as the CPU decodes", "[gpu]") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (const char* scheme :
       {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}) {
    const convert::GgufBlockType& type = *convert::FindGgufBlockType(scheme);
    // Random bytes with bit 6 cleared: every f16 field's exponent stays below 16 (finite).
    const uint64_t blocks = 1000;
    std::vector<std::byte> src = RandomBytes(blocks * type.block_bytes, rng);
    for (auto& b : src) b &= std::byte{0xBF};
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(scheme << " to " << TorchName(to));
      std::vector<std::byte> want(blocks * type.block_elems * (DTypeBits(to) / 8));
      REQUIRE(convert::DequantGgufBlocks(scheme, to, src.data(), want.data(), blocks).ok());
      Uploads up;
      std::byte* out = up.Output(want.size());
      REQUIRE(LaunchDequantGgufBlocks(scheme, to, up.Put(src), out, blocks, nullptr, SmCount(), 0)
                  .ok());
      CHECK(Fetch(out, want.size()) == want);
    }
  }
}

}  // namespace
}  // namespace loadstone::cuda
