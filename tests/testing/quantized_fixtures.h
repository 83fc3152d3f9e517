// The producers' quantized fixtures with their expected values, for the tests that load them
// onto a device (simulated: sim_test; real: gpu_load_test): each decoded weight of a load
// compared, bit for bit, with what its producer decodes it to.
#ifndef LOADSTONE_TESTS_TESTING_QUANTIZED_FIXTURES_H_
#define LOADSTONE_TESTS_TESTING_QUANTIZED_FIXTURES_H_

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "testing/file_bytes.h"

namespace loadstone::testing {

struct QuantFixture {
  std::string path, expected;  // under tests/fixtures
  std::string kernel;          // ConversionName of its weights' decode
  std::string renamed;         // the expected values' name of its one weight, when not its own
};

inline const std::vector<QuantFixture>& QuantFixtures() {
  static const std::vector<QuantFixture> kFixtures = {
      {"bnb/bnb4.safetensors", "bnb/expected.safetensors", "bnb4-dequant", ""},
      {"bnb/bnb8.safetensors", "bnb/expected8.safetensors", "bnb8-dequant", ""},
      {"ct/pack.safetensors", "ct/expected.safetensors", "int-dequant", ""},
      {"gptq/gptq4_desc_act", "gptq/expected.safetensors", "int-dequant", "gptq4_desc_act.weight"},
      {"gptq/awq4_g32", "gptq/expected.safetensors", "int-dequant", "awq4_g32.weight"},
      {"gguf/dequant/blocks.gguf", "gguf/dequant/expected.safetensors", "block-dequant", ""},
  };
  return kFixtures;
}

// The checkpoint at `path`, opened (the test stops with its status otherwise).
inline Checkpoint OpenFixture(const std::filesystem::path& path) {
  auto ckpt = Checkpoint::Open(path.string());
  INFO(path << ": " << ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  return *ckpt;
}

// How the fixtures' expected values name a target dtype: "f32", "bf16", "f16".
inline std::string DTypeSuffix(DType dtype) {
  return dtype == DType::kF32 ? "f32" : dtype == DType::kBF16 ? "bf16" : "f16";
}

inline std::string FixturePath(const std::string& path) {
  return std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/" + path;
}

// Every weight `plan` decodes (into `suffix`: "f32", "bf16", "f16") whose expected value the
// fixture has, from `load` (copied to the host), against it; returns how many were compared.
inline size_t CheckDecoded(const QuantFixture& fixture, const Checkpoint& ckpt,
                           const LoadPlan& plan, LoadHandle& load, const std::string& suffix) {
  auto expected = Checkpoint::Open(FixturePath(fixture.expected));
  REQUIRE(expected.ok());
  size_t compared = 0;
  for (const TensorPlan& tp : plan.tensors) {
    if (!Unpacks(tp.conversion)) continue;
    const TensorInfo& src = ckpt.tensors()[tp.source];
    const std::string base = fixture.renamed.empty() ? src.decoded_name() : fixture.renamed;
    const TensorInfo* want = expected->Find(base + "." + suffix);
    if (want == nullptr) continue;  // a case the fixture decodes into another dtype only
    INFO(src.name);
    ++compared;
    const Tensor& got = load.Tensor(src.name).get();
    std::vector<std::byte> host(got.nbytes());
    REQUIRE(got.CopyToHost(host).ok());
    CHECK(host == FileBytes(*expected, *want));
  }
  return compared;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_QUANTIZED_FIXTURES_H_
