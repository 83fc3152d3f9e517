// Plan() honours every PlanOptions field: budgets in placed bytes, one dtype rule, explicit maps,
// a model description's tree, the config's float8 block — and says when an option changes
// nothing. No I/O beyond writing the checkpoints.
#include <algorithm>

#include <catch2/catch.hpp>

#include "loadstone/plan.h"
#include "tests/runtime/pipeline/test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

std::vector<std::byte> Zeros(uint64_t n) { return std::vector<std::byte>(n); }

bool Mentions(const std::vector<std::string>& warnings, std::string_view text) {
  return std::any_of(warnings.begin(), warnings.end(),
                     [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

// Every device with a budget holds no more than it, in the bytes the plan places there.
void CheckWithinBudgets(const LoadPlan& plan) {
  uint64_t placed = 0;
  for (const DeviceUsage& u : plan.devices.usage) {
    INFO(u.device.ToString() << ": " << u.bytes << " of " << (u.budget ? *u.budget : 0));
    if (u.budget) CHECK(u.bytes <= *u.budget);
    placed += u.bytes;
  }
  CHECK(placed == plan.placed_bytes);
  uint64_t per_tensor = 0;
  for (const TensorPlan& t : plan.tensors) per_tensor += t.nbytes;
  CHECK(per_tensor == plan.placed_bytes);
}

TEST_CASE("plan options: a float8 weight dequantized into bf16 is budgeted as bf16") {
  TempDir dir;
  const auto w = Zeros(256 * 256), s = Zeros(2 * 2 * 4);
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"),
                           {{"w.weight", DType::kF8E4M3, {256, 256}, w, {}},
                            {"w.weight_scale_inv", DType::kF32, {2, 2}, s, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  PlanOptions po;
  po.dtype = DType::kBF16;
  po.device_map = "sequential";
  po.max_memory = MaxMemory{{"0", std::string("100KiB")}, {"cpu", std::string("1GiB")}};
  auto plan = Plan(*ckpt, po);
  REQUIRE(plan.ok());
  // 64 KiB stored, 128 KiB placed: it does not fit device 0's 100 KiB.
  CHECK(plan->devices.device_map.ToJson() == R"({"w": "cpu"})");
  CHECK(plan->placed_bytes == 256 * 256 * 2 + 16);
  CheckWithinBudgets(*plan);
  // accelerate's sizing (what `plan --model-json` keeps) would have put it there.
  auto tree = ModuleTree::FromCheckpoint(*ckpt);
  REQUIRE(tree.ok());
  auto accelerate = InferDeviceMap(*tree, po);
  REQUIRE(accelerate.ok());
  CHECK(accelerate->device_map.ToJson() == R"({"w": 0})");
  // With room for the placed bytes, device 0 takes it.
  po.max_memory = MaxMemory{{"0", std::string("200KiB")}, {"cpu", std::string("1GiB")}};
  auto roomy = Plan(*ckpt, po);
  REQUIRE(roomy.ok());
  CHECK(roomy->devices.device_map.ToJson() == R"({"w": 0})");
  CheckWithinBudgets(*roomy);
}

TEST_CASE("plan options: casts up are budgeted as placed, casts down as accelerate does") {
  TempDir dir;
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 8; ++i) data.push_back(Zeros(1024 * 2));
  for (int i = 0; i < 8; ++i) {
    tensors.push_back({"model.layers." + std::to_string(i) + ".w", DType::kF16, {1024}, data[i], {}});
  }
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"), tensors).ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  PlanOptions po;
  po.device_map = "sequential";
  po.max_memory = MaxMemory{{"0", int64_t{8192}}, {"cpu", int64_t{1 << 20}}};
  // Device 0 keeps room for the largest layer (accelerate's reserve on the main device), so it
  // takes 8 KiB minus one layer. Cast to f32, a layer is 4 KiB: one layer, where accelerate's
  // min(dtype, stored) sizing would count 2 KiB a layer and put three there.
  po.dtype = DType::kF32;
  auto up = Plan(*ckpt, po);
  REQUIRE(up.ok());
  CheckWithinBudgets(*up);
  CHECK(up->devices.usage.front().device == Device::Cuda(0));
  CHECK(up->devices.usage.front().bytes == 1 * 4096);
  po.dtype = DType::kBF16;  // the stored size: three layers of 2 KiB
  auto same = Plan(*ckpt, po);
  REQUIRE(same.ok());
  CHECK(same->devices.usage.front().bytes == 3 * 2048);
  CheckWithinBudgets(*same);
}

TEST_CASE("plan options: a dtype that is not a cast target is refused") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  for (DType bad : {DType::kF64, DType::kF8E4M3, DType::kF8E5M2, DType::kI8, DType::kBool}) {
    PlanOptions po;
    po.dtype = bad;
    auto plan = Plan(ckpt, po);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kInvalidArgument);
    CHECK(plan.status().message().find("casts to float32, float16 or bfloat16") != std::string_view::npos);
  }
  CHECK(IsCastTarget(DType::kBF16));
  CHECK_FALSE(IsCastTarget(DType::kF64));
}

TEST_CASE("plan options: options that change nothing are warned about") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  PlanOptions no_dtype;
  no_dtype.keep_in_fp32 = {"norm"};
  auto a = Plan(ckpt, no_dtype);
  REQUIRE(a.ok());
  CHECK(Mentions(a->warnings, "keep_in_fp32 has no effect without a target dtype"));
  PlanOptions f32;
  f32.dtype = DType::kF32;
  f32.keep_in_fp32 = {"nonexistent_module"};
  auto b = Plan(ckpt, f32);
  REQUIRE(b.ok());
  CHECK(Mentions(b->warnings, "keep_in_fp32 has no effect with the target dtype float32"));
  CHECK(Mentions(b->warnings, "keep_in_fp32 pattern 'nonexistent_module' matches no tensor"));
  PlanOptions special;
  special.special_dtypes["nonexistent.weight"] = DType::kBF16;
  auto c = Plan(ckpt, special);
  REQUIRE(c.ok());
  CHECK(Mentions(c->warnings, "special dtype for 'nonexistent.weight' names no tensor"));
  PlanOptions fine;
  fine.dtype = DType::kBF16;
  auto d = Plan(ckpt, fine);
  REQUIRE(d.ok());
  CHECK(d->warnings.empty());
}

TEST_CASE("plan options: special dtypes cast one tensor, an integer target is refused") {
  TempDir dir;
  const auto bytes = Zeros(64 * 4);
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"),
                           {{"a.weight", DType::kF32, {64}, bytes, {}},
                            {"b.weight", DType::kF32, {64}, bytes, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  PlanOptions po;
  po.special_dtypes["b.weight"] = DType::kF16;
  auto plan = Plan(*ckpt, po);
  REQUIRE(plan.ok());
  for (const TensorPlan& t : plan->tensors) {
    const bool b = ckpt->tensors()[t.source].name == "b.weight";
    CHECK(t.dtype == (b ? DType::kF16 : DType::kF32));
    CHECK(t.conversion == (b ? Conversion::kCast : Conversion::kNone));
  }
  CHECK(plan->placed_bytes == 64 * 4 + 64 * 2);
  po.special_dtypes["b.weight"] = DType::kI8;
  auto bad = Plan(*ckpt, po);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("special dtype int8 for tensor 'b.weight'") != std::string_view::npos);
}

TEST_CASE("plan options: no-split entries that cannot match a checkpoint's tree") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  PlanOptions po;
  po.device_map = "sequential";
  po.max_memory = MaxMemory{{"0", std::string("10MiB")}, {"cpu", std::string("1GiB")}};
  po.no_split = std::vector<std::string>{"LlamaDecoderLayer"};
  auto cls = Plan(ckpt, po);
  REQUIRE_FALSE(cls.ok());
  CHECK(cls.status().code() == StatusCode::kInvalidArgument);
  CHECK(cls.status().message().find("no-split entry 'LlamaDecoderLayer' matches no module") !=
        std::string_view::npos);
  CHECK(cls.status().message().find("model.layers.*") != std::string_view::npos);
  po.no_split = std::vector<std::string>{"foo.*"};
  auto glob = Plan(ckpt, po);
  REQUIRE(glob.ok());
  CHECK(Mentions(glob->warnings, "no-split entry 'foo.*' matches no module"));
}

TEST_CASE("plan options: an explicit map is used as given and must cover every tensor") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  auto map = DeviceMap::FromJson(R"({"model": "cpu", "lm_head": "cpu"})");
  REQUIRE(map.ok());
  PlanOptions po;
  po.explicit_map = *map;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  CHECK(plan->devices.device_map == *map);
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) CHECK(plan->device_of(t) == Device::Cpu());
  po.explicit_map = *DeviceMap::FromJson(R"({"model": "cpu"})");
  auto partial = Plan(ckpt, po);
  REQUIRE_FALSE(partial.ok());
  CHECK(partial.status().message().find("gives no device for tensor 'lm_head.weight'") !=
        std::string_view::npos);
}

TEST_CASE("plan options: a model description's tree plans the checkpoint's tensors") {
  TempDir dir;
  const auto bytes = Zeros(16 * 4);
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"),
                           {{"blocks.0.w", DType::kF32, {16}, bytes, {}},
                            {"blocks.1.w", DType::kF32, {16}, bytes, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  auto description = ParseModelDescription(R"({"modules": {"class": "Net", "children": [
      {"name": "blocks", "class": "ModuleList", "children": [
        {"name": "0", "class": "Block", "params": [{"name": "w", "shape": [16], "dtype": "float32"}]},
        {"name": "1", "class": "Block", "params": [{"name": "w", "shape": [16], "dtype": "float32"}]}]}]},
      "no_split": ["Block"]})");
  REQUIRE(description.ok());
  PlanOptions po;
  static_cast<DeviceMapOptions&>(po) = description->options;
  po.model = description->tree;
  po.device_map = "sequential";
  po.max_memory = MaxMemory{{"0", int64_t{128}}, {"cpu", int64_t{1000}}};  // one Block + reserve
  auto plan = Plan(*ckpt, po);
  REQUIRE(plan.ok());
  CHECK(plan->devices.no_split == std::vector<std::string>{"Block"});
  // Device 0 keeps a Block's room in reserve until the last Block comes (accelerate), then
  // takes it: both fit, and the map is cleaned to one key.
  CHECK(plan->devices.device_map.ToJson() == R"({"blocks": 0})");
  CHECK(plan->tensors.size() == 2);
  // The class name means something only on the description's tree: the checkpoint's own tree
  // has no classes.
  po.model.reset();
  auto bare = Plan(*ckpt, po);
  REQUIRE_FALSE(bare.ok());
  CHECK(bare.status().message().find("no-split entry 'Block' matches no module") != std::string_view::npos);
}

TEST_CASE("plan options: the float8 block comes from config.json unless given") {
  TempDir dir;
  const auto w = Zeros(256 * 256), s = Zeros(4 * 4 * 4);
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"),
                           {{"w.weight", DType::kF8E4M3, {256, 256}, w, {}},
                            {"w.weight_scale_inv", DType::kF32, {4, 4}, s, {}}})
              .ok());
  PlanOptions po;
  po.dtype = DType::kBF16;
  {
    auto ckpt = Checkpoint::Open(dir.path());  // no config: 128 x 128 needs 2 x 2 scales
    REQUIRE(ckpt.ok());
    CHECK(ckpt->config().path.empty());
    auto plan = Plan(*ckpt, po);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().message().find("--fp8-block") != std::string_view::npos);
  }
  dir.Write("config.json",
            R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})");
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  REQUIRE(ckpt->config().weight_block_size);
  CHECK(*ckpt->config().weight_block_size == std::array<uint64_t, 2>{64, 64});
  CHECK(ckpt->config().quant_method == "fp8");
  CHECK(ckpt->resolution().find("weight_block_size 64x64") != std::string::npos);
  auto plan = Plan(*ckpt, po);
  REQUIRE(plan.ok());
  CHECK(plan->fp8_block == std::array<uint64_t, 2>{64, 64});
  const auto dequant = std::find_if(plan->tensors.begin(), plan->tensors.end(), [](const TensorPlan& t) {
    return t.conversion == Conversion::kDequantFp8Block;
  });
  REQUIRE(dequant != plan->tensors.end());
  CHECK(dequant->block_rows == 64);
  po.fp8_block = std::array<uint64_t, 2>{128, 128};  // the flag wins
  CHECK_FALSE(Plan(*ckpt, po).ok());
  // A config whose block is malformed is not used, and that is said.
  dir.Write("config.json", R"({"quantization_config": {"weight_block_size": [64]}})");
  auto odd = Checkpoint::Open(dir.path());
  REQUIRE(odd.ok());
  CHECK_FALSE(odd->config().weight_block_size);
  REQUIRE(odd->warnings().size() == 1);
  CHECK(odd->warnings()[0].find("weight_block_size is an array of 1 values") != std::string::npos);
}

}  // namespace
}  // namespace loadstone
