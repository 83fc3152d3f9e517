// Helpers for the planner tests: model descriptions built in code (the modules of accelerate's
// own tests) and short ways to plan them.
#ifndef LOADSTONE_TESTS_RUNTIME_DEVICE_MAP_PLANNER_TEST_UTIL_H_
#define LOADSTONE_TESTS_RUNTIME_DEVICE_MAP_PLANNER_TEST_UTIL_H_

#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/device_map.h"

namespace loadstone::testing {

using Json = nlohmann::json;

inline Json Tensor(const std::string& name, std::vector<uint64_t> shape,
                   const std::string& dtype = "float32") {
  return Json{{"name", name}, {"shape", shape}, {"dtype", dtype}};
}

inline Json Module(const std::string& name, const std::string& cls, Json params = Json::array(),
                   Json children = Json::array(), Json buffers = Json::array()) {
  return Json{{"name", name}, {"class", cls}, {"params", std::move(params)},
              {"buffers", std::move(buffers)}, {"children", std::move(children)}};
}

// nn.Linear(in, out): weight [out, in], bias [out].
inline Json Linear(const std::string& name, uint64_t in, uint64_t out, bool bias = true) {
  Json params = Json::array({Tensor("weight", {out, in})});
  if (bias) params.push_back(Tensor("bias", {out}));
  return Module(name, "Linear", params);
}

// nn.BatchNorm1d(n): weight, bias; running_mean, running_var, num_batches_tracked (int64).
inline Json BatchNorm(const std::string& name, uint64_t n) {
  return Module(name, "BatchNorm1d", Json::array({Tensor("weight", {n}), Tensor("bias", {n})}),
                Json::array(),
                Json::array({Tensor("running_mean", {n}), Tensor("running_var", {n}),
                             Tensor("num_batches_tracked", {}, "int64")}));
}

// accelerate's ModelForTest: linear1 Linear(3,4) = 64 B, batchnorm BatchNorm1d(4) = 72 B,
// linear2 Linear(4,5) = 100 B; 236 B in float32.
inline Json ModelForTest(const std::string& name = "") {
  return Module(name, "ModelForTest", Json::array(),
                Json::array({Linear("linear1", 3, 4), BatchNorm("batchnorm", 4), Linear("linear2", 4, 5)}));
}

inline Json Sequential(Json children) {
  return Module("", "Sequential", Json::array(), std::move(children));
}

// A model description document around `modules`.
inline Json Doc(Json modules, Json max_memory, Json tied = Json::array()) {
  return Json{{"modules", std::move(modules)}, {"tied", std::move(tied)}, {"max_memory", std::move(max_memory)}};
}

inline ModelDescription Describe(const Json& doc) {
  auto description = ParseModelDescription(doc.dump());
  INFO(description.status().ToString());
  REQUIRE(description.ok());
  return std::move(description).value();
}

// Plans `doc` with its own options after `adjust` edits them.
template <typename Adjust>
DevicePlan PlanDoc(const Json& doc, Adjust adjust) {
  ModelDescription description = Describe(doc);
  DeviceMapOptions options = description.options;
  adjust(options);
  auto plan = InferDeviceMap(description.tree, options);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  return std::move(plan).value();
}

inline DevicePlan PlanDoc(const Json& doc) {
  return PlanDoc(doc, [](DeviceMapOptions&) {});
}

// The map as JSON text, e.g. {"linear1": 0, "batchnorm": 1}.
inline std::string MapJson(const DevicePlan& plan) { return plan.device_map.ToJson(); }

// infer_auto_device_map alone (mode "sequential": no balancing) with `no_split` classes.
inline std::string Infer(const Json& modules, const Json& max_memory, const Json& tied = Json::array(),
                         std::vector<std::string> no_split = {}) {
  Json doc = Doc(modules, max_memory, tied);
  doc["mode"] = "sequential";
  doc["no_split"] = no_split;
  return MapJson(PlanDoc(doc));
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_DEVICE_MAP_PLANNER_TEST_UTIL_H_
