// Single-thread CPU dequantization throughput per scheme, in GB/s of output (what a worker
// writes into the tensor), on pieces the size of a pipeline read (default 4 MiB of packed input
// per call) decoded into one reused buffer.
//
//   cmake --build build --target dequant_bench && build/bench/dequant_bench [MIB] [SECONDS]
//
// Inputs are random bytes whose f16 fields are finite normals (every byte in [0x10, 0x3B]), so
// that no case runs on a subnormal slow path; bitsandbytes absmax values are positive normals.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/convert/packed_int.h"

namespace {

using loadstone::DType;
using Clock = std::chrono::steady_clock;

std::vector<std::byte> RandomBytes(uint64_t n, uint8_t lo, uint8_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(dist(rng));
  return out;
}

// Runs `decode` (one call: the whole input) for `seconds`; prints output GB/s.
void Measure(const std::string& name, DType to, uint64_t out_bytes, double seconds,
             const std::function<void()>& decode) {
  decode();  // warm: pages touched, code loaded
  uint64_t calls = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    decode();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  std::printf("%-14s -> %-4s %8.2f GB/s of output\n", name.c_str(),
              std::string(loadstone::SafetensorsName(to)).c_str(),
              static_cast<double>(calls * out_bytes) / elapsed / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t in_bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4) << 20;
  const double seconds = argc > 2 ? std::strtod(argv[2], nullptr) : 1.0;
  const std::vector<std::byte> packed = RandomBytes(in_bytes, 0x10, 0x3B, 1);
  for (DType to : {DType::kBF16, DType::kF32}) {
    const uint64_t out_elem = loadstone::DTypeBits(to) / 8;
    for (const char* scheme :
         {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}) {
      const auto* type = loadstone::convert::FindGgufBlockType(scheme);
      const uint64_t blocks = in_bytes / type->block_bytes;
      std::vector<std::byte> out(blocks * type->block_elems * out_elem);
      Measure(scheme, to, out.size(), seconds, [&] {
        if (!loadstone::convert::DequantGgufBlocks(scheme, to, packed.data(), out.data(), blocks)
                 .ok()) {
          std::abort();
        }
      });
    }
    for (const bool fp4 : {false, true}) {
      for (const bool nested : {false, true}) {
        const uint64_t elements = in_bytes * 2;
        loadstone::PackedLayout layout;
        layout.scheme = fp4 ? "bnb-fp4" : "bnb-nf4";
        layout.element_shape = {elements};
        layout.block_elems = 64;
        layout.block_bytes = 32;
        auto state = std::make_shared<loadstone::Bnb4State>();
        state->fp4 = fp4;
        for (size_t k = 0; k < 16; ++k) state->code[k] = (static_cast<float>(k) - 7.5f) / 7.5f;
        state->nested = nested;
        state->nested_blocksize = 256;
        state->nested_offset = 0.01f;
        for (size_t k = 0; k < 256; ++k) state->nested_code[k] = static_cast<float>(k) / 255.0f;
        const uint64_t blocks = elements / 64;
        state->nested_absmax.assign(blocks / 256 + 1, 0.05f);
        layout.bnb4 = state;
        std::vector<std::byte> absmax(blocks * 4);
        if (nested) {
          absmax = RandomBytes(blocks, 0, 255, 2);
        } else {
          std::vector<float> values(blocks, 0.05f);
          std::memcpy(absmax.data(), values.data(), absmax.size());
        }
        std::vector<std::byte> out(elements * out_elem);
        Measure(std::string(layout.scheme) + (nested ? "+nested" : ""), to, out.size(), seconds,
                [&] {
                  if (!loadstone::convert::DequantBnb4(layout, to, packed.data(), 0, elements,
                                                       absmax.data(), out.data())
                           .ok()) {
                    std::abort();
                  }
                });
      }
    }
    // 4-bit packed integers, groups of 128, asymmetric: compressed-tensors (bf16 scales, packed
    // along the input dim), GPTQ and AWQ (f16 scales, the weight stored [in, out]: a worker
    // decodes it whole, in output order).
    const std::pair<const char*, loadstone::PackOrder> orders[] = {
        {"ct-int4", loadstone::PackOrder::kRows},
        {"gptq-int4", loadstone::PackOrder::kGptq},
        {"awq-int4", loadstone::PackOrder::kAwq}};
    for (const auto& [name, order] : orders) {
      loadstone::PackedIntState state;
      state.order = order;
      state.bits = 4;
      state.cols = 4096;
      state.rows = in_bytes / (state.cols / 2);
      state.groups = state.cols / 128;
      state.group_size = 128;
      state.scale_dtype = order == loadstone::PackOrder::kRows ? DType::kBF16 : DType::kF16;
      state.zeros.assign(state.rows * state.groups, 9);
      const std::vector<std::byte> scales = RandomBytes(state.rows * state.groups * 2, 0x10, 0x3B, 3);
      std::vector<std::byte> out(state.rows * state.cols * out_elem);
      Measure(name, to, out.size(), seconds, [&] {
        if (!loadstone::convert::DequantPackedInt(state, to, packed.data(), 0, 0,
                                                  state.rows * state.cols, scales.data(), out.data())
                 .ok()) {
          std::abort();
        }
      });
    }
    const uint64_t cols = 4096, rows = in_bytes / cols;
    std::vector<float> scb(rows, 1.5f);
    std::vector<std::byte> out(rows * cols * out_elem);
    Measure("bnb-int8", to, out.size(), seconds, [&] {
      if (!loadstone::convert::DequantBnbInt8(to, packed.data(), 0, rows * cols, cols,
                                              reinterpret_cast<const std::byte*>(scb.data()),
                                              out.data())
               .ok()) {
        std::abort();
      }
    });
  }
  return 0;
}
