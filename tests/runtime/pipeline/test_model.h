// A generated multi-shard checkpoint with mixed dtypes and known contents, for pipeline tests.
#ifndef LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_
#define LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"
#include "testing/temp_dir.h"

namespace loadstone::testing {

// Byte `i` of tensor `seed`: a hash, so that misplaced bytes are caught.
inline std::byte PatternByte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (i + 0x632BE59BD9B4E019ULL);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xFF);
}

struct TestTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
};

// Tensors of every size class: big (several 16 MiB chunks), medium, small (coalesced), scalar,
// empty; float, integer and bool dtypes.
inline std::vector<TestTensor> MixedTensors() {
  return {
      {"model.embed_tokens.weight", DType::kBF16, {4096, 2600}},  // ~20 MiB: two chunks
      {"model.layers.0.attn.q.weight", DType::kF32, {512, 600}},
      {"model.layers.0.attn.q.bias", DType::kF32, {512}},
      {"model.layers.0.norm.weight", DType::kF16, {300}},
      {"model.layers.0.steps", DType::kI64, {}},
      {"model.layers.0.mask", DType::kBool, {7, 3}},
      {"model.layers.1.attn.q.weight", DType::kF16, {700, 1100}},
      {"model.layers.1.empty", DType::kF32, {0, 4}},
      {"model.layers.1.ids", DType::kI32, {1000}},
      {"model.layers.2.fp8.weight", DType::kF8E4M3, {256, 256}},
      {"model.layers.10.attn.q.weight", DType::kBF16, {1024, 1000}},
      {"model.layers.10.tokens", DType::kU8, {5000}},
      {"model.norm.weight", DType::kF64, {128}},
      {"lm_head.weight", DType::kBF16, {2048, 1500}},
  };
}

inline uint64_t Bytes(const TestTensor& t) {
  uint64_t n = DTypeBits(t.dtype) / 8;
  for (uint64_t d : t.shape) n *= d;
  return n;
}

inline std::vector<std::byte> Expected(size_t index, const TestTensor& t) {
  std::vector<std::byte> out(Bytes(t));
  for (uint64_t i = 0; i < out.size(); ++i) out[i] = PatternByte(index, i);
  // float8: avoid NaN codes so that casts compare by value.
  if (t.dtype == DType::kF8E4M3) {
    for (auto& b : out) {
      if ((static_cast<uint8_t>(b) & 0x7F) == 0x7F) b = std::byte{0};
    }
  }
  return out;
}

// Writes MixedTensors() as a sharded checkpoint (~8 MB shards) into `dir` and opens it.
inline Checkpoint WriteMixedCheckpoint(const TempDir& dir, uint64_t max_shard = 8'000'000) {
  const auto specs = MixedTensors();
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i) data.push_back(Expected(i, specs[i]));
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.push_back({specs[i].name, specs[i].dtype, specs[i].shape, data[i], {}});
  }
  ShardedWriteOptions options;
  options.max_shard_size = max_shard;
  auto written = WriteShardedSafetensors(dir.path(), tensors, options);
  REQUIRE(written.ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  return *ckpt;
}

inline size_t SpecIndex(const std::string& name) {
  const auto specs = MixedTensors();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return i;
  }
  FAIL("unknown tensor " << name);
  return 0;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_
