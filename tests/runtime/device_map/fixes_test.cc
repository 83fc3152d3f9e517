// The reference's known defects, kept by default and fixed behind ReferenceFixes.
#include <catch2/catch.hpp>

#include "tests/runtime/device_map/device_map_test_util.h"

namespace loadstone {
namespace {

using testing::Json;
using testing::Linear;
using testing::Module;
using testing::Tensor;

Json TwelveLinears() {
  Json children = Json::array();
  for (int i = 0; i < 12; ++i) children.push_back(Linear(std::to_string(i), 2, 2));
  return testing::Sequential(children);
}

TEST_CASE("fix: tied parameters are matched by dotted prefix, not substring", "[planner][fixes]") {
  // "5.weight" is tied to "11.weight". accelerate's test `"1." in "11.weight."` takes module 1 to
  // hold 11.weight, so module 1 drags module 5 along (and accelerate then raises IndexError when
  // it reaches 11; loadstone's reference mode skips the missing tied module instead).
  Json doc = testing::Doc(TwelveLinears(), {{"0", 10000}}, Json::array({Json::array({"5.weight", "11.weight"})}));
  doc["mode"] = "sequential";
  doc["no_split"] = Json::array();
  auto plan = [&](bool fix) {
    return testing::PlanDoc(doc, [&](DeviceMapOptions& o) {
      o.clean_result = false;
      o.explain = true;
      o.fixes.prefix_tie_test = fix;
    });
  };
  DevicePlan reference = plan(false);
  CHECK(testing::MapJson(reference) ==
        R"({"0": 0, "1": 0, "5": 0, "2": 0, "3": 0, "4": 0, "6": 0, "7": 0, "8": 0, "9": 0, "10": 0, "11": 0})");
  CHECK(std::find(reference.explanation.begin(), reference.explanation.end(),
                  "Putting 1 and ['5'] (available=9952) on 0.") != reference.explanation.end());
  DevicePlan fixed = plan(true);
  CHECK(testing::MapJson(fixed) ==
        R"({"0": 0, "1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "11": 0, "6": 0, "7": 0, "8": 0, "9": 0, "10": 0})");
  CHECK(std::find(fixed.explanation.begin(), fixed.explanation.end(),
                  "  So those parameters need to be taken into account ['11.weight']") != fixed.explanation.end());
}

// A module with children and a buffer of its own, split across devices.
Json BlockWithBuffer() {
  Json block = Module("block", "Block", Json::array(),
                      Json::array({Linear("lin1", 2, 2), Linear("lin2", 2, 2), Linear("lin3", 2, 2)}),
                      Json::array({Tensor("scale", {4})}));
  return testing::Sequential(Json::array({block}));
}

TEST_CASE("fix: a split module's direct buffers are queued", "[planner][fixes]") {
  // accelerate 1.15 gives {"block.lin1": 0, "block.lin2": "cpu", "block.lin3": "cpu"}.
  Json doc = testing::Doc(BlockWithBuffer(), {{"0", 50}, {"cpu", 1000}});
  doc["mode"] = "sequential";
  doc["no_split"] = Json::array();
  ModelDescription d = testing::Describe(doc);
  DevicePlan reference = testing::PlanDoc(doc);
  CHECK(testing::MapJson(reference) == R"({"block.lin1": 0, "block.lin2": "cpu", "block.lin3": "cpu"})");
  CHECK_FALSE(CheckDeviceMap(d.tree, reference.device_map).ok());  // block.scale has no device
  REQUIRE_FALSE(reference.warnings.empty());
  CHECK(reference.warnings.back().find("covered by no key") != std::string::npos);
  DevicePlan fixed = testing::PlanDoc(doc, [](DeviceMapOptions& o) { o.fixes.requeue_split_buffers = true; });
  CHECK(testing::MapJson(fixed) ==
        R"({"block.lin1": 0, "block.lin2": "cpu", "block.lin3": "cpu", "block.scale": "cpu"})");
  CHECK(CheckDeviceMap(d.tree, fixed.device_map).ok());
  CHECK(fixed.usage.back().device == Device::Cpu());
  CHECK(fixed.usage.back().bytes == 24 + 24 + 16);
}

TEST_CASE("fix: buffers of disk-mapped modules are loaded", "[planner][fixes]") {
  // accelerate 1.15 gives {"lin": 0, "bn": "disk", "lin2": "disk"}.
  Json doc = testing::Doc(
      testing::Sequential(Json::array({Linear("lin", 2, 2), testing::BatchNorm("bn", 4), Linear("lin2", 2, 2)})),
      {{"0", 96}});
  doc["mode"] = "sequential";
  doc["no_split"] = Json::array();
  DevicePlan reference = testing::PlanDoc(doc);
  CHECK(testing::MapJson(reference) == R"({"lin": 0, "bn": "disk", "lin2": "disk"})");
  REQUIRE(reference.buffers.size() == 3);
  for (const BufferPlacement& b : reference.buffers) CHECK_FALSE(b.device.has_value());  // not loaded
  DevicePlan fixed = testing::PlanDoc(doc, [](DeviceMapOptions& o) { o.fixes.load_disk_buffers = true; });
  CHECK(testing::MapJson(fixed) == testing::MapJson(reference));
  REQUIRE(fixed.buffers.size() == 3);
  CHECK(fixed.buffers[0].name == "bn.running_mean");
  for (const BufferPlacement& b : fixed.buffers) CHECK(b.device == Device::Cuda(0));
  // offload_buffers: buffers stay with their module, nothing to report.
  DevicePlan offloaded = testing::PlanDoc(doc, [](DeviceMapOptions& o) { o.offload_buffers = true; });
  CHECK(offloaded.buffers.empty());
}

TEST_CASE("fixes leave the accelerate cases unchanged where no defect is hit", "[planner][fixes]") {
  // ModelForTest has no ties, no split module with buffers: every fix gives the same map.
  Json seq = testing::Sequential(Json::array({testing::ModelForTest("0"), testing::ModelForTest("1")}));
  Json doc = testing::Doc(seq, {{"0", 300}, {"1", 300}});
  doc["no_split"] = Json::array();
  DevicePlan a = testing::PlanDoc(doc);
  DevicePlan b = testing::PlanDoc(doc, [](DeviceMapOptions& o) { o.fixes = ReferenceFixes::All(); });
  CHECK(testing::MapJson(a) == testing::MapJson(b));
}

}  // namespace
}  // namespace loadstone
