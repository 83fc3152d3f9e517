// GPTQ and AWQ checkpoints (tests/fixtures/make_gptq_fixtures.py: AutoGPTQ 0.7.1's own packing
// and CPU dequantization, AutoAWQ 0.2.9's from_linear and dequantize_gemm) loaded and
// dequantized, on the CPU and on a simulated GPU, against the producers' decode, bit for bit;
// kept packed byte for byte; hostile settings and quant states refused.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "runtime/pipeline/test_model.h"
#include "loadstone/platform.h"
#include "testing/file_bytes.h"
#include "testing/quantized_fixtures.h"
#include "testing/rewritten_checkpoint.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::FileBytes;
using testing::HostBytes;
using testing::Named;
using testing::TempDir;
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/gptq";
const std::vector<std::string> kCases = {"gptq4_g32",     "gptq4_g32_nowrap", "gptq4_desc_act",
                                         "gptq4_no_gidx", "gptq4_one_group",  "gptq4_sym",
                                         "gptq2_g32",     "gptq3_g32",        "gptq8_g64",
                                         "gptq4_v2",      "awq4_g32"};

const PackedIntState& StateOf(const Checkpoint& ckpt) {
  const TensorInfo& w = *ckpt.Find("layer.qweight");
  REQUIRE((w.packed && w.packed->packed_int));
  return *w.packed->packed_int;
}

TEST_CASE("gptq/awq: the catalog reads scheme, shape, zeros and groups from the producers' files",
          "[quant]") {
  const Checkpoint g4 = testing::OpenFixture(kFixtures / "gptq4_g32");
  const TensorInfo& w = *g4.Find("layer.qweight");
  REQUIRE(w.packed);
  CHECK(w.packed->scheme == "gptq-int4");
  CHECK(w.packed->element_shape == std::vector<uint64_t>{64, 128});
  CHECK(w.packed->decoded_name == "layer.weight");
  const PackedIntState& s = StateOf(g4);
  CHECK(s.order == PackOrder::kGptq);
  CHECK(s.groups == 4);
  CHECK(s.zeros.size() == 64 * 4);
  CHECK(s.zeros[0] == 0);  // zero 0 is stored minus one, all ones: (0xF + 1) & 0xF
  CHECK(s.g_idx.size() == 128);
  CHECK(s.companions == std::vector<std::string>{"layer.scales", "layer.qzeros", "layer.g_idx"});

  CHECK(StateOf(testing::OpenFixture(kFixtures / "gptq3_g32")).bits == 3);
  CHECK(StateOf(testing::OpenFixture(kFixtures / "gptq8_g64")).scale_dtype == DType::kBF16);
  CHECK(StateOf(testing::OpenFixture(kFixtures / "gptq4_one_group")).groups == 1);
  const Checkpoint sym_ckpt = testing::OpenFixture(kFixtures / "gptq4_sym");
  const PackedIntState& sym = StateOf(sym_ckpt);
  CHECK(std::all_of(sym.zeros.begin(), sym.zeros.end(), [](int16_t z) { return z == 8; }));
  const Checkpoint no_gidx = testing::OpenFixture(kFixtures / "gptq4_no_gidx");  // quantize_config.json only
  CHECK(StateOf(no_gidx).g_idx.empty());
  CHECK(StateOf(no_gidx).group_size == 32);
  CHECK(no_gidx.config().quant_method == "gptq");
  CHECK(testing::OpenFixture(kFixtures / "gptq4_v2").Find("layer.qweight")->packed->scheme == "gptq_v2-int4");
  const Checkpoint awq = testing::OpenFixture(kFixtures / "awq4_g32");
  CHECK(awq.Find("layer.qweight")->packed->scheme == "awq-int4");
  CHECK(StateOf(awq).order == PackOrder::kAwq);
  CHECK(StateOf(awq).rows == 128);
}

TEST_CASE("gptq/awq: every case dequantizes as its producer does, bit for bit", "[quant]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  // The smallest reads (4 KiB) cut gptq4_desc_act's and awq4_g32's weights, were they not read
  // whole.
  const uint64_t max_chunk = GENERATE(uint64_t{16} << 20, uint64_t{4096});
  const bool gpu = GENERATE(false, true);
  INFO(testing::DTypeSuffix(dtype) << ", max_chunk " << max_chunk << (gpu ? ", simulated cuda:0" : ""));
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected.safetensors");
  for (const std::string& c : kCases) {
    INFO(c);
    const Checkpoint ckpt = testing::OpenFixture(kFixtures / c);
    PlanOptions opt;
    opt.dtype = dtype;
    opt.max_chunk = max_chunk;
    if (gpu) {
      opt.platform = Platform::Simulated(SimulatedMachine{{1ULL << 30}, 8ULL << 30}.WithDevices());
      opt.device_map = "cuda:0";
    }
    auto plan = Plan(ckpt, opt);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    const TensorInfo& weight = *ckpt.Find("layer.qweight");
    for (const ReadChunk& r : plan->reads) {  // the weight is read whole, whatever max_chunk
      if (r.offset < weight.offset + weight.nbytes && weight.offset < r.offset + r.length) {
        CHECK(r.offset <= weight.offset);
        CHECK(r.offset + r.length >= weight.offset + weight.nbytes);
      }
    }
    LoaderOptions lo;
    lo.platform = opt.platform;
    Loader loader(lo);
    LoadHandle load = loader.Load(ckpt, *plan);
    const Status done = load.Done().get();
    INFO(done.ToString());
    REQUIRE(done.ok());
    const Tensor& got = load.Tensor("layer.qweight").get();
    const TensorInfo& want = *expected.Find(c + ".weight." + testing::DTypeSuffix(dtype));
    CHECK(got.dtype() == dtype);
    CHECK(got.shape() == want.shape);
    CHECK(got.device() == (gpu ? "cuda:0" : "cpu"));
    CHECK(HostBytes(got) == FileBytes(expected, want));
  }
}

TEST_CASE("gptq/awq: kept packed, every tensor lands as the file holds it", "[quant]") {
  const std::string c = GENERATE(as<std::string>{}, "gptq3_g32", "awq4_g32");
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / c);
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  opt.keep_packed = true;
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  for (const TensorInfo& t : ckpt.tensors()) {
    INFO(t.name);
    const Tensor& got = load.Tensor(t.name).get();
    CHECK(got.dtype() == t.dtype);
    CHECK(got.shape() == t.shape);
    CHECK(HostBytes(got) == FileBytes(ckpt, t));
  }
}

TEST_CASE("gptq/awq: without a quantization config", "[quant]") {
  SECTION("a qweight with a g_idx reads as GPTQ v1, with a warning") {
    const Checkpoint ckpt = testing::OpenFixture(kFixtures / "gptq4_g32/model.safetensors");
    CHECK(ckpt.Find("layer.qweight")->packed->scheme == "gptq-int4");
    REQUIRE(ckpt.warnings().size() == 1);
    CHECK_THAT(ckpt.warnings()[0], Catch::Contains("read as GPTQ v1"));
  }
  SECTION("an AWQ qweight loads as stored, with a warning") {
    const Checkpoint ckpt = testing::OpenFixture(kFixtures / "awq4_g32/model.safetensors");
    CHECK_FALSE(ckpt.Find("layer.qweight")->packed);
    REQUIRE(ckpt.warnings().size() == 1);
    CHECK_THAT(ckpt.warnings()[0], Catch::Contains("loaded as stored, not dequantized"));
  }
}

TEST_CASE("gptq/awq: hostile settings and quant states are refused naming the tensor", "[quant]") {
  const std::string gptq_config =
      R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}})";
  const std::vector<testing::RefusedCase> gptq = {
      {"no qzeros", testing::Without("layer.qzeros"), StatusCode::kNotFound, "layer.qzeros"},
      {"no scales", testing::Without("layer.scales"), StatusCode::kNotFound, "layer.scales"},
      {"qzeros of no width", testing::Reshaped("layer.qzeros", {4, 7}), StatusCode::kCorruption,
       "layer.qzeros"},
      {"scales of other outputs", testing::Reshaped("layer.scales", {4, 32}),
       StatusCode::kCorruption, "has 32 outputs"},
      {"a g_idx outside the groups",
       [](auto* t, auto* d) {
         TensorToWrite& g = Named(t, "layer.g_idx");
         std::vector<std::byte> bytes(g.data.begin(), g.data.end());
         const int32_t bad = 4;
         std::memcpy(bytes.data() + 4 * 7, &bad, 4);
         d->push_back(bytes);
         g.data = d->back();
       },
       StatusCode::kCorruption, "column 7 group 4"},
      {"a g_idx of other columns", testing::Reshaped("layer.g_idx", {100}), StatusCode::kCorruption,
       "layer.g_idx"},
  };
  testing::CheckRefused(testing::OpenFixture(kFixtures / "gptq4_g32"), "layer.", gptq, gptq_config);

  const Checkpoint source = testing::OpenFixture(kFixtures / "gptq4_g32");
  const std::vector<std::pair<std::string, std::string>> configs = {
      {R"({"quantization_config": {"quant_method": "gptq", "bits": 8}})", "says bits 8"},
      {R"({"quantization_config": {"quant_method": "gptq", "checkpoint_format": "marlin"}})",
       "checkpoint_format 'marlin'"},
      {R"({"quantization_config": {"quant_method": "awq", "version": "gemv"}})", "version 'gemv'"},
      {R"({"quantization_config": {"quant_method": "gptq", "bits": "four"}})", ""},
  };
  for (const auto& [config, says] : configs) {
    INFO(config);
    TempDir dir;
    dir.Write("config.json", config);
    testing::Rewrite(
        source, "layer.", dir, [](auto*, auto*) {}, "model.safetensors");
    auto ckpt = Checkpoint::Open(dir.path());
    if (says.empty()) {  // a config loadstone cannot read is set aside, with a warning
      REQUIRE(ckpt.ok());
      CHECK_THAT(ckpt->warnings().front(), Catch::Contains("not an integer"));
      continue;
    }
    REQUIRE_FALSE(ckpt.ok());
    CHECK_THAT(std::string(ckpt.status().message()), Catch::Contains(says));
  }
}

}  // namespace
}  // namespace loadstone
