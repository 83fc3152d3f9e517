// A generated multi-shard checkpoint with mixed dtypes and known contents, for pipeline tests.
#ifndef LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_
#define LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_

#include <cstdint>
#include <cmath>
#include <fstream>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
#include "testing/temp_dir.h"

// A failed CHECK on two byte vectors prints their sizes and first bytes: Catch's own printing
// of megabytes (and its line wrapping, quadratic) made such a failure run for many minutes.
template <>
struct Catch::StringMaker<std::vector<std::byte>> {
  static std::string convert(const std::vector<std::byte>& bytes) {
    std::string out = std::to_string(bytes.size()) + " bytes {";
    for (size_t i = 0; i < bytes.size() && i < 16; ++i) {
      static constexpr char kHex[] = "0123456789abcdef";
      const auto b = static_cast<unsigned>(bytes[i]);
      if (i) out.push_back(' ');
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
    return out + (bytes.size() > 16 ? " ...}" : "}");
  }
};

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

// Writes `tensors` as Hugging Face shards of at most `max_shard` bytes into `dir`; opens them.
inline Checkpoint WriteAndOpen(const TempDir& dir, const std::vector<TensorToWrite>& tensors,
                               uint64_t max_shard) {
  ShardedWriteOptions options;
  options.max_shard_size = max_shard;
  auto written = WriteShardedSafetensors(dir.path(), tensors, options);
  REQUIRE(written.ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  return *std::move(ckpt);
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
  return WriteAndOpen(dir, tensors, max_shard);
}

// The mixed checkpoint in a temporary folder, and its default plan.
struct MixedModel {
  static LoadPlan PlanOf(const Checkpoint& ckpt, const PlanOptions& options = {}) {
    auto plan = Plan(ckpt, options);
    REQUIRE(plan.ok());
    return *std::move(plan);
  }
  TempDir dir;
  Checkpoint ckpt = WriteMixedCheckpoint(dir);
  LoadPlan plan = PlanOf(ckpt);
};

// A plan of `ckpt` whose every chunk goes through the reader (a slow one in tests that act on a
// running load): no page-cache copies.
inline LoadPlan EveryChunkRead(const Checkpoint& ckpt) {
  PlanOptions po;
  po.routes.fill_fresh_pages = false;
  return MixedModel::PlanOf(ckpt, po);
}

inline size_t SpecIndex(const std::string& name) {
  const auto specs = MixedTensors();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) return i;
  }
  FAIL("unknown tensor " << name);
  return 0;
}

// The tensor's bytes, copied from whichever device holds them.
inline std::vector<std::byte> HostBytes(const Tensor& t) {
  std::vector<std::byte> host(t.nbytes());
  REQUIRE(t.CopyToHost(host).ok());
  return host;
}

// A loaded MixedTensors() tensor (no conversion) holds exactly its generated bytes.
inline void CheckTensorBytes(const Tensor& t) {
  const size_t i = SpecIndex(t.name());
  const auto expected = Expected(i, MixedTensors()[i]);
  CHECK(HostBytes(t) == expected);
}

// DeepSeek-V3-style float8 weights with `_scale_inv` siblings (ragged 128 x 128 blocks, one of
// them e5m2, one small enough to be coalesced were it not paired), a float8 weight without
// scales, and bf16 neighbours. The scales are written last, so that small shards put them in
// other files than their weights. Contents: random codes (NaN included), DeepSeek-like scales.
struct Fp8Checkpoint {
  Checkpoint ckpt;
  std::map<std::string, std::vector<std::byte>> bytes;  // as written
};

inline std::vector<TestTensor> Fp8Tensors() {
  return {
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {300}},
      {"model.layers.0.mlp.down_proj.weight", DType::kF8E4M3, {700, 300}},
      {"model.layers.0.mlp.up_proj.weight", DType::kF8E4M3, {256, 384}},
      {"model.layers.0.self_attn.o_proj.weight", DType::kF8E5M2, {130, 129}},
      {"model.layers.1.mlp.gate_proj.weight", DType::kF8E4M3, {1000, 520}},
      {"model.layers.1.plain_fp8.weight", DType::kF8E4M3, {64, 64}},
      {"lm_head.weight", DType::kBF16, {100, 300}},
      {"model.layers.0.mlp.down_proj.weight_scale_inv", DType::kF32, {6, 3}},
      {"model.layers.0.mlp.up_proj.weight_scale_inv", DType::kF32, {2, 3}},
      {"model.layers.0.self_attn.o_proj.weight_scale_inv", DType::kF32, {2, 2}},
      {"model.layers.1.mlp.gate_proj.weight_scale_inv", DType::kF32, {8, 5}},
  };
}

inline Fp8Checkpoint WriteFp8Checkpoint(const TempDir& dir, uint64_t max_shard = 300'000) {
  std::map<std::string, std::vector<std::byte>> bytes;
  const auto specs = Fp8Tensors();
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<std::byte> data = Expected(100 + i, specs[i]);
    if (specs[i].dtype == DType::kF32) {  // scales: 2^-14 .. 2^-6, mantissas from the pattern
      for (size_t k = 0; k < data.size() / 4; ++k) {
        const float s = std::ldexp(1.0f + static_cast<float>(data[4 * k]) / 256.0f,
                                   -6 - static_cast<int>(data[4 * k + 1]) % 9);
        std::memcpy(&data[4 * k], &s, 4);
      }
    } else if (specs[i].dtype == DType::kF8E4M3) {
      data = std::vector<std::byte>(data.size());  // Expected() avoids NaN codes: use all codes
      for (size_t k = 0; k < data.size(); ++k) data[k] = PatternByte(100 + i, k);
    }
    bytes[specs[i].name] = std::move(data);
  }
  for (const TestTensor& t : specs) {
    tensors.push_back({t.name, t.dtype, t.shape, bytes[t.name], {}});
  }
  return {WriteAndOpen(dir, tensors, max_shard), std::move(bytes)};
}

// The load's trace (LoadOptions::trace), written into `dir` and read back as text.
inline std::string TraceText(const LoadHandle& load, const TempDir& dir) {
  REQUIRE(load.WriteTrace(dir.Path("trace.json")).ok());
  std::ifstream in(dir.Path("trace.json"), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_MODEL_H_
