// The min-max strategy: an optimal contiguous partition, and where it beats the greedy map.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>

#include <catch2/catch.hpp>

#include "runtime/device_map/min_max.h"
#include "tests/runtime/device_map/device_map_test_util.h"

namespace loadstone {
namespace {

using testing::Json;

// The best largest part over every split of `sizes` into caps.size() contiguous runs.
int64_t BruteForce(const std::vector<int64_t>& sizes, const std::vector<int64_t>& caps, size_t part,
                   size_t start) {
  if (part == caps.size()) return start == sizes.size() ? 0 : INT64_MAX;
  const int64_t cap = caps.at(part);
  int64_t best = INT64_MAX;
  int64_t load = 0;
  for (size_t end = start;; ++end) {
    if (load <= cap) {
      int64_t rest = BruteForce(sizes, caps, part + 1, end);
      if (rest != INT64_MAX) best = std::min(best, std::max(load, rest));
    }
    if (end == sizes.size()) break;
    load += sizes[end];
  }
  return best;
}

TEST_CASE("min-max partition equals brute force", "[planner][minmax]") {
  uint32_t seed = std::random_device{}();
  std::cout << "min-max partition seed " << seed << "\n";
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> sizes(rng() % 9);
    for (int64_t& s : sizes) s = static_cast<int64_t>(rng() % 20);
    std::vector<int64_t> caps(1 + rng() % 4);
    for (int64_t& c : caps) c = static_cast<int64_t>(rng() % 60);
    int64_t expected = BruteForce(sizes, caps, 0, 0);
    std::vector<size_t> counts = device_map::MinMaxPartition(sizes, caps);
    if (expected == INT64_MAX) {
      CHECK(counts.empty());
      continue;
    }
    REQUIRE(counts.size() == caps.size());
    int64_t largest = 0;
    size_t at = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      int64_t load = 0;
      for (size_t k = 0; k < counts[p]; ++k) load += sizes[at++];
      CHECK(load <= caps[p]);
      largest = std::max(largest, load);
    }
    CHECK(at == sizes.size());
    CHECK(largest == expected);
  }
}

// The largest planned load over the GPUs.
uint64_t LargestGpuLoad(const DevicePlan& plan) {
  uint64_t largest = 0;
  for (const DeviceUsage& u : plan.usage) {
    if (u.device.is_gpu()) largest = std::max(largest, u.bytes);
  }
  return largest;
}

uint64_t GpuBytes(const DevicePlan& plan) {
  uint64_t total = 0;
  for (const DeviceUsage& u : plan.usage) total += u.device.is_gpu() ? u.bytes : 0;
  return total;
}

// embed (200 B), six blocks (80 B each), head (200 B).
Json Pipeline() {
  Json children = Json::array({testing::Module("embed", "Embedding", Json::array({testing::Tensor("weight", {50})}))});
  for (int i = 0; i < 6; ++i) {
    children.push_back(testing::Module("block" + std::to_string(i), "Block", Json::array({testing::Tensor("weight", {20})})));
  }
  children.push_back(testing::Module("head", "Linear", Json::array({testing::Tensor("weight", {50})})));
  return testing::Sequential(children);
}

TEST_CASE("min-max beats greedy: a smaller largest GPU load, nothing more offloaded", "[planner][minmax]") {
  Json doc = testing::Doc(Pipeline(), {{"0", 600}, {"1", 600}, {"cpu", 10000}});
  doc["no_split"] = Json::array();
  for (const char* mode : {"sequential", "balanced"}) {
    INFO(mode);
    doc["mode"] = mode;
    DevicePlan greedy = testing::PlanDoc(doc);
    DevicePlan min_max = testing::PlanDoc(doc, [](DeviceMapOptions& o) { o.strategy = PlanStrategy::kMinMax; });
    std::cout << mode << " greedy  " << testing::MapJson(greedy) << "\nmin-max " << testing::MapJson(min_max) << "\n";
    CHECK(LargestGpuLoad(greedy) == 520);  // embed + 2 blocks | 4 blocks + head
    CHECK(LargestGpuLoad(min_max) == 440);  // embed + 3 blocks | 3 blocks + head
    CHECK(GpuBytes(min_max) == GpuBytes(greedy));
    CHECK(testing::MapJson(min_max) ==
          R"({"embed": 0, "block0": 0, "block1": 0, "block2": 0, "block3": 1, "block4": 1, "block5": 1, "head": 1})");
  }
}

TEST_CASE("min-max keeps the longest prefix on the GPUs and reserves room for an offloaded layer",
          "[planner][minmax]") {
  Json doc = testing::Doc(Pipeline(), {{"0", 400}, {"1", 300}, {"cpu", 10000}});
  doc["no_split"] = Json::array();
  doc["mode"] = "sequential";
  DevicePlan plan = testing::PlanDoc(doc, [](DeviceMapOptions& o) {
    o.strategy = PlanStrategy::kMinMax;
    o.explain = true;
  });
  // 880 bytes do not fit 700: head (200 B) goes to cpu and GPU 0 keeps 200 B free for it.
  CHECK(testing::MapJson(plan) ==
        R"({"embed": 0, "block0": 1, "block1": 1, "block2": 1, "block3": "cpu", "block4": "cpu", "block5": "cpu", "head": "cpu"})");
  CHECK(LargestGpuLoad(plan) == 240);
}

// Where both put the same bytes on the GPUs, min-max's largest GPU load is never larger.
TEST_CASE("min-max over the devmap cases: never a larger GPU load for as many GPU bytes", "[planner][minmax]") {
  const std::filesystem::path folder = std::filesystem::path(LOADSTONE_SOURCE_DIR) / "tests/data/devmap";
  int compared = 0, better = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    std::string file = entry.path().filename().string();
    if (!file.ends_with(".input.json")) continue;
    auto d = ReadModelDescription(entry.path().string());
    REQUIRE(d.ok());
    DeviceMapOptions options = d->options;
    options.device_map = "sequential";
    auto greedy = InferDeviceMap(d->tree, options);
    options.strategy = PlanStrategy::kMinMax;
    auto min_max = InferDeviceMap(d->tree, options);
    REQUIRE(greedy.ok());
    REQUIRE(min_max.ok());
    int gpus = 0;
    for (const DeviceUsage& u : greedy->usage) gpus += u.device.is_gpu() ? 1 : 0;
    if (gpus < 2 || GpuBytes(*min_max) != GpuBytes(*greedy)) continue;
    ++compared;
    INFO(file);
    CHECK(LargestGpuLoad(*min_max) <= LargestGpuLoad(*greedy));
    if (LargestGpuLoad(*min_max) < LargestGpuLoad(*greedy)) ++better;
  }
  std::cout << "min-max vs greedy (sequential) on " << compared << " multi-GPU cases: smaller largest load in "
            << better << "\n";
  CHECK(compared > 0);
}

}  // namespace
}  // namespace loadstone
