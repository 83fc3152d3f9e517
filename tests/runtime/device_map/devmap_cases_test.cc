// Every tests/data/devmap/NAME.input.json (a model description) must plan to exactly the map in
// NAME.output.json (accelerate's answer): same keys, same order, same devices.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <catch2/catch.hpp>

#include "loadstone/device_map.h"

namespace loadstone {
namespace {

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  const std::filesystem::path folder = std::filesystem::path(LOADSTONE_SOURCE_DIR) / "tests/data/devmap";
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    std::string file = entry.path().filename().string();
    const std::string suffix = ".input.json";
    if (file.size() > suffix.size() && file.ends_with(suffix)) {
      names.push_back(file.substr(0, file.size() - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("devmap cases: the same map as accelerate, key order included", "[planner][cases]") {
  const std::filesystem::path folder = std::filesystem::path(LOADSTONE_SOURCE_DIR) / "tests/data/devmap";
  std::vector<std::string> names = CaseNames();
  REQUIRE(names.size() >= 40);
  size_t agree = 0;
  for (const std::string& name : names) {
    INFO("case " << name);
    auto description = ReadModelDescription((folder / (name + ".input.json")).string());
    REQUIRE(description.ok());
    auto plan = InferDeviceMap(description->tree, description->options);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    std::string expected_text = ReadText(folder / (name + ".output.json"));
    std::string got_text = "{\"device_map\": " + plan->device_map.ToJson() + "}";
    // The ordered entries, parsed independently of the text form.
    const std::string prefix = "{\"device_map\": ";
    REQUIRE(expected_text.starts_with(prefix));
    auto expected = DeviceMap::FromJson(expected_text.substr(prefix.size(), expected_text.size() - prefix.size() - 1));
    REQUIRE(expected.ok());
    CHECK(plan->device_map.entries() == expected->entries());
    CHECK(got_text == expected_text);
    if (plan->device_map == *expected && got_text == expected_text) ++agree;
  }
  std::cout << "devmap cases: " << agree << " of " << names.size() << " agree with accelerate\n";
  CHECK(agree == names.size());
}

}  // namespace
}  // namespace loadstone
