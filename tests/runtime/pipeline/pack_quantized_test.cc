// compressed-tensors pack-quantized and float-quantized checkpoints
// (tests/fixtures/make_ct_fixtures.py: compressed-tensors 0.12.2's own quantize, packing and
// dequantize) loaded and dequantized, on the CPU and on a simulated GPU, against
// compressed-tensors' decode, bit for bit; hostile quant states refused.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
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
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/ct";
const std::vector<std::string> kCases = {"sym4_group",    "asym4_group", "sym8_channel",
                                         "asym8_channel", "sym2_group",  "gidx4"};

TEST_CASE("pack-quantized: the catalog reads shapes, zero points and activation order", "[quant]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "pack.safetensors");
  const TensorInfo& asym = *ckpt.Find("asym4_group.weight_packed");
  REQUIRE((asym.packed && asym.packed->packed_int));
  CHECK(asym.packed->scheme == "ct-int4");
  CHECK(asym.packed->element_shape == std::vector<uint64_t>{196, 128});
  CHECK(asym.packed->decoded_name == "asym4_group.weight");
  const PackedIntState& s = *asym.packed->packed_int;
  CHECK(s.bits == 4);
  CHECK(s.groups == 4);
  CHECK(s.group_size == 32);
  CHECK(s.zeros.size() == 196 * 4);
  CHECK(s.companions.front() == "asym4_group.weight_scale");
  CHECK(ckpt.Find("sym2_group.weight_packed")->packed->scheme == "ct-int2");
  CHECK(ckpt.Find("sym8_channel.weight_packed")->packed->packed_int->scale_dtype == DType::kF16);
  CHECK(ckpt.Find("gidx4.weight_packed")->packed->packed_int->g_idx.size() == 128);
}

TEST_CASE("pack-quantized: every case dequantizes as compressed-tensors does, bit for bit",
          "[quant]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  const uint64_t max_chunk = GENERATE(uint64_t{16} << 20, uint64_t{4096});
  const bool gpu = GENERATE(false, true);
  INFO(testing::DTypeSuffix(dtype) << ", max_chunk " << max_chunk << (gpu ? ", simulated cuda:0" : ""));
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "pack.safetensors");
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected.safetensors");
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
  size_t decoded = 0;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    const TensorPlan& tp = plan->tensors[i];
    const std::string& name = ckpt.tensors()[tp.source].name;
    if (tp.conversion == Conversion::kDequantPackedInt) {
      ++decoded;
      CHECK(plan->device_of(tp.scale) == Device::Cpu());
    } else {  // scales, shapes, zero points, g_idx: as stored
      CHECK(tp.conversion == Conversion::kNone);
      CHECK(name.find(".weight_") != std::string::npos);
    }
  }
  CHECK(decoded == kCases.size());
  LoaderOptions lo;
  lo.platform = opt.platform;
  Loader loader(lo);
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status done = load.Done().get();
  INFO(done.ToString());
  REQUIRE(done.ok());
  for (const std::string& c : kCases) {
    INFO(c);
    const Tensor& got = load.Tensor(c + ".weight_packed").get();
    const TensorInfo& want = *expected.Find(c + ".weight." + testing::DTypeSuffix(dtype));
    CHECK(got.dtype() == dtype);
    CHECK(got.shape() == want.shape);
    CHECK(got.device() == (gpu ? "cuda:0" : "cpu"));
    CHECK(HostBytes(got) == FileBytes(expected, want));
  }
}

// compressed-tensors float-quantized weights (make_ct_fixtures.py: its FloatQuantizationCompressor
// and dequantize) per tensor, channel, group of 64 and 128 x 128 block, with f32, bf16 and f16
// scales: x_q.to(scale.dtype) * scale, then the target — on the CPU and on a simulated GPU.
TEST_CASE("float-quantized: every strategy dequantizes as compressed-tensors does, bit for bit",
          "[quant]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  const bool gpu = GENERATE(false, true);
  INFO(testing::DTypeSuffix(dtype) << (gpu ? ", simulated cuda:0" : ""));
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "float.safetensors");
  const Checkpoint expected = testing::OpenFixture(kFixtures / "float_expected.safetensors");
  PlanOptions opt;
  opt.dtype = dtype;
  if (gpu) {
    opt.platform = Platform::Simulated(SimulatedMachine{{1ULL << 30}, 8ULL << 30}.WithDevices());
    opt.device_map = "cuda:0";
  }
  auto plan = Plan(ckpt, opt);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  size_t dequantized = 0;
  for (const TensorPlan& tp : plan->tensors) {
    dequantized += tp.conversion == Conversion::kDequantFp8Block;
  }
  CHECK(dequantized == 4);
  LoaderOptions lo;
  lo.platform = opt.platform;
  Loader loader(lo);
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status done = load.Done().get();
  INFO(done.ToString());
  REQUIRE(done.ok());
  for (const std::string c : {"f8_tensor", "f8_channel", "f8_group", "f8_block"}) {
    INFO(c);
    const Tensor& got = load.Tensor(c + ".weight").get();
    const TensorInfo& want = *expected.Find(c + ".weight." + testing::DTypeSuffix(dtype));
    CHECK(got.dtype() == dtype);
    CHECK(HostBytes(got) == FileBytes(expected, want));
  }
}

TEST_CASE("pack-quantized: a hostile quant state is refused naming the tensor", "[quant]") {
  auto shape_of = [](int64_t rows, int64_t cols) {
    return [rows, cols](std::vector<TensorToWrite>* t, std::vector<std::vector<std::byte>>* d) {
      std::vector<std::byte> bytes(16);
      std::memcpy(bytes.data(), &rows, 8);
      std::memcpy(bytes.data() + 8, &cols, 8);
      d->push_back(bytes);
      Named(t, "asym4_group.weight_shape").data = d->back();
    };
  };
  const std::vector<testing::RefusedCase> cases = {
      {"no weight_shape",
       testing::Without("asym4_group.weight_shape"),
       StatusCode::kNotFound, "asym4_group.weight_shape"},
      {"rows that disagree", shape_of(195, 128), StatusCode::kCorruption, "has 196 rows"},
      {"columns no width packs", shape_of(196, 1000), StatusCode::kCorruption, "no code width"},
      {"a negative dimension", shape_of(-196, 128), StatusCode::kCorruption, "positive"},
      {"scales of another shape",
       [](auto* t, auto*) {
         TensorToWrite& s = Named(t, "asym4_group.weight_scale");
         s.shape = {98, 8};
       },
       StatusCode::kCorruption, "asym4_group.weight_scale"},
      {"zero points unpacked",
       [](auto* t, auto*) {
         TensorToWrite& z = Named(t, "asym4_group.weight_zero_point");
         z.shape = {50, 2};
       },
       StatusCode::kCorruption, "packed along the output dim"},
      {"8 columns: 2- or 4-bit codes alike",
       [&](auto* t, auto* d) {
         shape_of(196, 8)(t, d);
         TensorToWrite& w = Named(t, "asym4_group.weight_packed");
         w.shape = {196, 1};
         w.data = w.data.subspan(0, 196 * 4);
       },
       StatusCode::kUnsupported, "fit codes of 2 and 4 bits"},
      {"a g_idx outside the groups",
       [](auto* t, auto* d) {
         std::vector<std::byte> bytes(128 * 4);
         const int32_t bad = 9;
         std::memcpy(bytes.data() + 4 * 5, &bad, 4);
         d->push_back(bytes);
         t->push_back({"asym4_group.weight_g_idx", DType::kI32, {128}, d->back(), {}});
       },
       StatusCode::kCorruption, "column 5 group 9"},
  };
  testing::CheckRefused(testing::OpenFixture(kFixtures / "pack.safetensors"), "asym4_group.", cases);
}

}  // namespace
}  // namespace loadstone
