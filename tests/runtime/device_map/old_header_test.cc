// loadstone/devices.h, where Device, DeviceMap and the budgets were declared before they moved to
// loadstone/device_map.h (issue 32): a program that includes only the old header still builds and
// gets the same declarations, for the release it is kept.
#include "loadstone/devices.h"

#include <catch2/catch.hpp>

TEST_CASE("the old header devices.h still declares Device, DeviceMap and the budgets") {
  auto device = loadstone::ParseDevice("cuda:1");
  REQUIRE(device.ok());
  CHECK(*device == loadstone::Device::Cuda(1));
  loadstone::DeviceMap map;
  REQUIRE(map.Add("model.layers.0", *device).ok());
  CHECK(map.ToJson() == R"({"model.layers.0": 1})");
  const loadstone::MaxMemory budgets{{"0", std::string("1GiB")}};
  CHECK(loadstone::ParseSizeString(std::get<std::string>(budgets.at("0"))).value() == (1ULL << 30));
  // The planning functions come with it, from device_map.h.
  loadstone::DeviceMapOptions options;
  CHECK(!options.max_memory.has_value());
}
