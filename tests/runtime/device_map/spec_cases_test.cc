// The numbered cases of specs/device-map.md (accelerate's own tests), built in code.
#include <catch2/catch.hpp>

#include "runtime/device_map/clean.h"
#include "tests/runtime/device_map/device_map_test_util.h"

namespace loadstone {
namespace {

using testing::BatchNorm;
using testing::Infer;
using testing::Json;
using testing::Linear;
using testing::ModelForTest;
using testing::Module;
using testing::Sequential;

Json Gpus(std::initializer_list<std::pair<const char*, int>> budgets) {
  Json mm = Json::object();
  for (auto [k, v] : budgets) mm[k] = v;
  return mm;
}

TEST_CASE("spec 1: ModelForTest over two and three GPUs", "[planner][spec]") {
  Json m = ModelForTest();
  CHECK(Infer(m, Gpus({{"0", 200}, {"1", 200}})) == R"({"linear1": 0, "batchnorm": 1, "linear2": 1})");
  CHECK(Infer(m, Gpus({{"0", 200}, {"1", 172}, {"2", 200}})) ==
        R"({"linear1": 0, "batchnorm": 1, "linear2": 1})");
}

TEST_CASE("spec 2: tied weights inside one module", "[planner][spec]") {
  Json tied = Json::array({Json::array({"linear2.weight", "linear1.weight"})});
  CHECK(Infer(ModelForTest(), Gpus({{"0", 200}, {"1", 200}}), tied) == R"({"": 0})");
}

TEST_CASE("spec 3: Sequential(M, M, M), with and without no_split", "[planner][spec]") {
  Json seq = Sequential(Json::array({ModelForTest("0"), ModelForTest("1"), ModelForTest("2")}));
  CHECK(Infer(seq, Gpus({{"0", 500}, {"1", 500}})) ==
        R"({"0": 0, "1.linear1": 0, "1.batchnorm": 0, "1.linear2": 1, "2": 1})");
  CHECK(Infer(seq, Gpus({{"0", 500}, {"1", 500}}), Json::array(), {"ModelForTest"}) ==
        R"({"0": 0, "1": 1, "2": 1})");
}

// Key order as accelerate 1.15 returns it (its own tests compare dicts, ignoring order). With
// two tie groups accelerate's order depends on Python's string hashing; loadstone takes groups in
// model order, which is one of accelerate's two outcomes (the other puts layer2.linear2 first).
TEST_CASE("spec 4: tied parameters across layers", "[planner][spec]") {
  Json seq = Sequential(Json::array({ModelForTest("layer1"), ModelForTest("layer2"), ModelForTest("layer3")}));
  Json mm = Gpus({{"0", 400}, {"1", 500}});
  Json tied = Json::array({Json::array({"layer1.linear2.weight", "layer3.linear2.weight"})});
  CHECK(Infer(seq, mm, tied) ==
        R"({"layer1": 0, "layer3.linear2": 0, "layer3.linear1": 1, "layer3.batchnorm": 1, "layer2": 1})");
  tied[0].push_back("layer2.linear2.weight");
  CHECK(Infer(seq, mm, tied) ==
        R"({"layer1": 0, "layer2.linear2": 0, "layer3.linear2": 0, "layer2.linear1": 1, )"
        R"("layer2.batchnorm": 1, "layer3.linear1": 1, "layer3.batchnorm": 1})");
  tied.push_back(Json::array({"layer1.linear1.weight", "layer2.linear1.weight"}));
  CHECK(Infer(seq, mm, tied) ==
        R"({"layer1": 0, "layer2.linear1": 0, "layer2.linear2": 0, "layer3.linear2": 0, )"
        R"("layer2.batchnorm": 1, "layer3.linear1": 1, "layer3.batchnorm": 1})");
}

TEST_CASE("spec 5: a module tied whole (weight and bias) to an earlier one", "[planner][spec]") {
  Json seq = Sequential(Json::array({Linear("linear1", 4, 4), Linear("linear2", 6, 6),
                                     Linear("linear3", 4, 4), Linear("linear4", 6, 6)}));
  Json tied = Json::array({Json::array({"linear1.weight", "linear3.weight"}),
                           Json::array({"linear1.bias", "linear3.bias"})});
  CHECK(Infer(seq, Gpus({{"0", 250}, {"1", 400}}), tied) ==
        R"({"linear1": 0, "linear3": 0, "linear2": 1, "linear4": 1})");
}

TEST_CASE("spec 6: fallback_allocation", "[planner][spec]") {
  Json inner = Module("module", "Sequential", Json::array(),
                      Json::array({Linear("linear1", 10, 4), Linear("linear2", 4, 4), Linear("linear3", 4, 8)}));
  Json doc = testing::Doc(Sequential(Json::array({inner})), Gpus({{"0", 256}}));
  doc["mode"] = "sequential";
  doc["no_split"] = Json::array();
  doc["fallback_allocation"] = true;
  DevicePlan on = testing::PlanDoc(doc);
  CHECK(testing::MapJson(on) == R"({"module.linear2": 0, "module.linear1": "disk", "module.linear3": "disk"})");
  doc["fallback_allocation"] = false;
  DevicePlan off = testing::PlanDoc(doc);
  CHECK(off.device_map.Lookup("module.linear2.weight") == Device::Disk());
  bool has_message = false;
  for (const std::string& w : off.warnings) {
    has_message = has_message || (w.find("no modules could be assigned to the following devices") !=
                                      std::string::npos &&
                                  w.find("  - 0: ") != std::string::npos);
  }
  CHECK(has_message);
}

TEST_CASE("spec 7: clean_device_map", "[planner][spec]") {
  auto gpu = [](int i) { return Device::Cuda(i); };
  std::vector<DeviceMap::Entry> raw = {{"a.x", gpu(0)},   {"a.y", gpu(0)},   {"b.x.0", gpu(1)},
                                       {"b.x.1", gpu(1)}, {"b.y.0", gpu(2)}, {"b.y.1", gpu(2)},
                                       {"c", gpu(2)}};
  std::vector<DeviceMap::Entry> cleaned = device_map::CleanDeviceMap(raw);
  DeviceMap map;
  for (auto& e : cleaned) REQUIRE(map.Add(e.prefix, e.device).ok());
  CHECK(map.ToJson() == R"({"c": 2, "a": 0, "b.x": 1, "b.y": 2})");
  // Every key on one device: the root collapses; a single entry is never lifted.
  CHECK(device_map::CleanDeviceMap({{"a", gpu(0)}, {"b", gpu(0)}}) ==
        std::vector<DeviceMap::Entry>{{"", gpu(0)}});
  CHECK(device_map::CleanDeviceMap({{"a.b.c", gpu(0)}}) ==
        std::vector<DeviceMap::Entry>{{"a.b.c", gpu(0)}});
}

// get_balanced_memory on ModelForTest (236 bytes): the budgets the plan reports.
std::vector<std::pair<std::string, uint64_t>> Balanced(Json mm, const char* mode = "balanced") {
  Json doc = testing::Doc(ModelForTest(), mm);
  doc["mode"] = mode;
  doc["no_split"] = Json::array();
  DevicePlan plan = testing::PlanDoc(doc);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const DeviceUsage& u : plan.usage) {
    if (u.budget) out.push_back({u.device.ToKey(), *u.budget});
  }
  return out;
}

using Budgets = std::vector<std::pair<std::string, uint64_t>>;

TEST_CASE("spec: get_balanced_memory cases", "[planner][spec]") {
  CHECK(Balanced({{"0", 200}, {"1", 200}}) == Budgets{{"0", 200}, {"1", 200}});
  CHECK(Balanced({{"0", 200}, {"2", 200}}) == Budgets{{"0", 200}, {"2", 200}});
  CHECK(Balanced({{"0", 300}, {"1", 300}}) == Budgets{{"0", 215}, {"1", 300}});
  CHECK(Balanced({{"0", 300}, {"1", 500}}) == Budgets{{"0", 215}, {"1", 500}});
  CHECK(Balanced({{"0", 300}, {"cpu", 1000}}) == Budgets{{"0", 300}, {"cpu", 1000}});
  CHECK(Balanced({{"0", 0}, {"1", 300}, {"2", 300}}) == Budgets{{"0", 0}, {"1", 215}, {"2", 300}});
  CHECK(Balanced({{"0", 0}, {"cpu", 100}}) == Budgets{{"0", 0}, {"cpu", 100}});
  // balanced_low_0: GPU 0 keeps only what the others cannot hold.
  CHECK(Balanced({{"0", 300}, {"1", 300}}, "balanced_low_0") == Budgets{{"0", 0}, {"1", 300}});
  CHECK(Balanced({{"0", 300}, {"1", 100}}, "balanced_low_0") == Budgets{{"0", 136}, {"1", 100}});
}

TEST_CASE("spec: balanced_low_0 with GPUs not numbered 0..N-1 is refused", "[planner][spec]") {
  Json doc = testing::Doc(ModelForTest(), {{"0", 300}, {"2", 300}});
  doc["mode"] = "balanced_low_0";
  ModelDescription d = testing::Describe(doc);
  auto plan = InferDeviceMap(d.tree, d.options);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("spec: the offload_buffers warning", "[planner][spec]") {
  // Two BatchNorms offloaded to cpu: 80 bytes of buffers do not fit next to linear1 on GPU 0.
  Json seq = Sequential(Json::array({Linear("linear1", 2, 4), BatchNorm("bn_a", 4), BatchNorm("bn_b", 4)}));
  Json doc = testing::Doc(seq, {{"0", 125}, {"cpu", 1000}});
  doc["mode"] = "sequential";
  doc["no_split"] = Json::array();
  DevicePlan plan = testing::PlanDoc(doc);
  CHECK(testing::MapJson(plan) == R"({"linear1": 0, "bn_a": "cpu", "bn_b": "cpu"})");
  REQUIRE(plan.warnings.size() == 1);
  CHECK(plan.warnings[0] ==
        "Current model requires 80 bytes of buffer for offloaded layers, which seems does not fit "
        "any GPU's remaining memory. If you are experiencing a OOM later, please consider using "
        "offload_buffers=True.");
  // The buffers of cpu-mapped modules are loaded on the main device.
  REQUIRE(plan.buffers.size() == 6);
  CHECK(plan.buffers[0].name == "bn_a.running_mean");
  CHECK(plan.buffers[0].device == Device::Cuda(0));
  doc["offload_buffers"] = true;
  DevicePlan quiet = testing::PlanDoc(doc);
  CHECK(testing::MapJson(quiet) == testing::MapJson(plan));  // placement unchanged
  CHECK(quiet.warnings.empty());
  CHECK(quiet.buffers.empty());
}

}  // namespace
}  // namespace loadstone
