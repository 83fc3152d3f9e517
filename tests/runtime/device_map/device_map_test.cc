// Devices, DeviceMap, device_map strings, max_memory keys, check_device_map, disk offload.
#include <catch2/catch.hpp>

#include "loadstone/writer.h"
#include "tests/runtime/device_map/device_map_test_util.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

using testing::Json;

TEST_CASE("devices: parse and print", "[planner][device]") {
  CHECK(*ParseDevice("cuda:3") == Device::Cuda(3));
  CHECK(*ParseDevice("3") == Device::Cuda(3));
  CHECK(*ParseDevice("cuda") == Device::Cuda(0));
  CHECK(*ParseDevice("cpu") == Device::Cpu());
  CHECK(*ParseDevice("disk") == Device::Disk());
  CHECK(*ParseDevice("mps") == Device::Mps());
  for (const char* bad : {"gpu", "cuda:-1", "-1", "cuda:x", "", "CPU", "cuda:99999999999"}) {
    INFO(bad);
    CHECK_FALSE(ParseDevice(bad).ok());
  }
  CHECK(Device::Cuda(1).ToString() == "cuda:1");
  CHECK(Device::Cuda(1).ToJsonValue() == "1");
  CHECK(Device::Disk().ToJsonValue() == "\"disk\"");
  CHECK(Device::Cuda(9) < Device::Mps());
  CHECK(Device::Mps() < Device::Cpu());
  CHECK(Device::Cpu() < Device::Disk());
}

TEST_CASE("device map: longest dotted prefix", "[planner][device]") {
  DeviceMap map;
  REQUIRE(map.Add("model.layers.1", Device::Cuda(1)).ok());
  REQUIRE(map.Add("model", Device::Cuda(0)).ok());
  REQUIRE(map.Add("model.layers.1.mlp.up", Device::Cpu()).ok());
  CHECK_FALSE(map.Add("model", Device::Cpu()).ok());
  CHECK(map.Lookup("model.layers.1.self_attn.q.weight") == Device::Cuda(1));
  CHECK(map.Lookup("model.layers.11.weight") == Device::Cuda(0));  // "1" is not a prefix of "11"
  CHECK(map.Lookup("model.layers.1.mlp.up.weight") == Device::Cpu());
  CHECK(map.Lookup("model.layers.1.mlp.upper.weight") == Device::Cuda(1));
  CHECK(map.Lookup("model") == Device::Cuda(0));
  CHECK_FALSE(map.Lookup("lm_head.weight").has_value());
  DeviceMap all;
  REQUIRE(all.Add("", Device::Disk()).ok());
  CHECK(all.Lookup("anything.at.all") == Device::Disk());
}

TEST_CASE("device map: JSON as json.dumps writes hf_device_map", "[planner][device]") {
  auto map = DeviceMap::FromJson(R"({"z": 0, "a.b": "cpu", "m": "disk", "q": "cuda:2", "é": 1})");
  REQUIRE(map.ok());
  CHECK(map->ToJson() == R"({"z": 0, "a.b": "cpu", "m": "disk", "q": 2, "\u00e9": 1})");
  CHECK(map->entries()[0].prefix == "z");  // order kept
  CHECK_FALSE(DeviceMap::FromJson(R"({"a": 0, "a": 1})").ok());
  CHECK_FALSE(DeviceMap::FromJson(R"({"a": -1})").ok());
  CHECK_FALSE(DeviceMap::FromJson(R"({"a": "gpu"})").ok());
  CHECK_FALSE(DeviceMap::FromJson(R"([1])").ok());
  CHECK_FALSE(DeviceMap::FromJson(R"({"a": 1.5})").ok());
}

Json Small() { return testing::Sequential(Json::array({testing::Linear("a", 2, 2), testing::Linear("b", 2, 2)})); }

Result<DevicePlan> PlanMode(const std::string& mode) {
  ModelDescription d = testing::Describe(testing::Doc(Small(), {{"0", 1000}, {"cpu", 1000}}));
  d.options.device_map = mode;
  return InferDeviceMap(d.tree, d.options);
}

TEST_CASE("device_map strings: devices, ints and errors as diffusers validates them", "[planner][device]") {
  CHECK(PlanMode("cpu")->device_map.ToJson() == R"({"": "cpu"})");
  CHECK(PlanMode("cuda:1")->device_map.ToJson() == R"({"": 1})");
  CHECK(PlanMode("cuda")->device_map.ToJson() == R"({"": 0})");
  CHECK(PlanMode("2")->device_map.ToJson() == R"({"": 2})");
  CHECK(PlanMode("auto")->device_map.ToJson() == R"({"": 0})");
  auto negative = PlanMode("-1");
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().message() ==
        "You can't pass device_map as a negative int. If you want to put the model on the cpu, pass "
        "device_map = 'cpu'");
  for (const char* bad : {"disk", "gpu", "Auto", "balanced_low_1", ""}) {
    auto r = PlanMode(bad);
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message() ==
          "When passing device_map as a string, the value needs to be a device name (e.g. cpu, "
          "cuda:0) or 'auto', 'balanced', 'balanced_low_0', 'sequential' but found " +
              std::string(bad) + ".");
  }
}

TEST_CASE("max_memory: keys and values as get_max_memory takes them", "[planner][device]") {
  ModelDescription d = testing::Describe(testing::Doc(Small(), {{"0", 1000}}));
  d.options.device_map = "sequential";
  d.options.max_memory = MaxMemory{{"cuda:1", "1KB"}, {"0", int64_t{10}}, {"cpu", 2.5e3}};
  auto plan = InferDeviceMap(d.tree, d.options);
  REQUIRE(plan.ok());
  REQUIRE(plan->usage.size() == 3);  // 0, 1, cpu (disk has no budget and got nothing)
  CHECK(plan->usage[0].device == Device::Cuda(0));
  CHECK(plan->usage[0].budget == 10u);
  CHECK(plan->usage[1].budget == 1000u);
  CHECK(plan->usage[2].budget == 2500u);
  d.options.max_memory = MaxMemory{{"gpu0", int64_t{10}}};
  auto bad = InferDeviceMap(d.tree, d.options);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "Device gpu0 is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' "
        "and 'disk'");
  d.options.max_memory = MaxMemory{{"0", int64_t{10}}, {"cuda:0", int64_t{10}}};
  CHECK_FALSE(InferDeviceMap(d.tree, d.options).ok());
  d.options.max_memory = MaxMemory{{"0", "10"}};
  CHECK_FALSE(InferDeviceMap(d.tree, d.options).ok());  // a string needs a unit
}

TEST_CASE("default budgets: the platform's GPUs and available RAM", "[planner][device]") {
  ModelDescription d = testing::Describe(testing::Doc(Small(), nullptr));
  d.options.device_map = "sequential";
  d.options.platform = Platform::Simulated({});  // no GPU, this machine's host memory
  auto no_gpu = InferDeviceMap(d.tree, d.options);
  REQUIRE(no_gpu.ok());
  CHECK(no_gpu->device_map.ToJson() == R"({"": "cpu"})");
  DeviceMapOptions on_gpus = d.options;
  on_gpus.platform = Platform::Simulated({{1000, 2000}, std::nullopt});
  auto with_gpus = InferDeviceMap(d.tree, on_gpus);
  REQUIRE(with_gpus.ok());
  CHECK(with_gpus->device_map.ToJson() == R"({"": 0})");
  CHECK(with_gpus->usage[1].budget == 2000u);
}

TEST_CASE("check_device_map: every state-dict tensor covered", "[planner][device]") {
  Json doc = testing::Doc(testing::Sequential(Json::array({testing::Linear("a", 2, 2), testing::BatchNorm("bn", 2)})),
                          nullptr);
  ModelDescription d = testing::Describe(doc);
  auto map = DeviceMap::FromJson(R"({"a": 0, "bn.weight": "cpu", "nothing": 1})");
  REQUIRE(map.ok());
  std::vector<std::string> warnings;
  Status s = CheckDeviceMap(d.tree, *map, &warnings);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() ==
        "The device_map provided does not give any device for the following parameters: bn.bias, "
        "bn.running_mean, bn.running_var, bn.num_batches_tracked");
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] ==
        "The following device_map keys do not match any submodules in the model: ['bn.weight', 'nothing']");
  CHECK(CheckDeviceMap(d.tree, *DeviceMap::FromJson(R"({"": "cpu"})")).ok());
  CHECK(CheckDeviceMap(d.tree, *DeviceMap::FromJson(R"({"a": 0, "bn": 1})")).ok());
}

TEST_CASE("disk offload needs a folder unless the source is safetensors", "[planner][device]") {
  auto map = *DeviceMap::FromJson(R"({"a": 0, "b": "disk"})");
  CHECK(CheckDiskOffload(map, "", /*source_is_safetensors=*/true).ok());
  CHECK(CheckDiskOffload(map, "/tmp/offload", false).ok());
  Status s = CheckDiskOffload(map, "", false);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("`offload_folder`") != std::string_view::npos);
  CHECK(CheckDiskOffload(*DeviceMap::FromJson(R"({"": 0})"), "", false).ok());
}

TEST_CASE("module tree from a checkpoint: numbered order, default no-split", "[planner][device]") {
  testing::TempDir dir;
  std::vector<TensorToWrite> tensors;
  std::vector<float> zeros(16, 0.0f);
  auto bytes = std::as_bytes(std::span<const float>(zeros.data(), 4));
  for (const char* name : {"model.layers.10.w", "model.layers.2.w", "model.layers.1.w", "model.norm.w",
                           "model.embed.w", "lm_head.w"}) {
    tensors.push_back(TensorToWrite{name, DType::kF32, {4}, bytes, {}});
  }
  REQUIRE(WriteSafetensors(dir.Path("m.safetensors"), tensors).ok());
  auto ckpt = Checkpoint::Open(dir.Path("m.safetensors"));
  REQUIRE(ckpt.ok());
  DeviceMapOptions options;
  options.device_map = "sequential";
  options.max_memory = MaxMemory{{"0", int64_t{64}}, {"cpu", int64_t{1000}}};
  options.clean_result = false;
  auto plan = InferDeviceMap(*ckpt, options);
  REQUIRE(plan.ok());
  CHECK(plan->default_no_split);
  CHECK(plan->no_split == std::vector<std::string>{"model.layers.*"});
  CHECK(plan->device_map.ToJson() ==
        R"({"lm_head": 0, "model.embed": 0, "model.layers.1": 0, "model.layers.2": "cpu", )"
        R"("model.layers.10": "cpu", "model.norm": "cpu"})");
  auto tree = ModuleTree::FromCheckpoint(*ckpt);
  REQUIRE(tree.ok());
  CHECK_FALSE(tree->has_classes());
  CHECK(tree->num_tensors() == 6);
}

}  // namespace
}  // namespace loadstone
