// keep_in_fp32: loadstone's rule is the anchored dotted component `(^|\.)key($|\.)`, for any
// reduced float target dtype; those tensors are planned at their float32 size.
#include <catch2/catch.hpp>

#include "runtime/device_map/module_sizes.h"
#include "tests/runtime/device_map/device_map_test_util.h"

namespace loadstone {
namespace {

using testing::Json;
using testing::Module;
using testing::Tensor;

TEST_CASE("keep_in_fp32: dotted components only", "[planner][fp32]") {
  CHECK(MatchesModulePattern("model.norm.weight", "norm"));
  CHECK(MatchesModulePattern("norm.weight", "norm"));
  CHECK(MatchesModulePattern("model.norm", "norm"));
  CHECK(MatchesModulePattern("model.layers.0.mlp.weight", "layers.0"));
  CHECK_FALSE(MatchesModulePattern("model.layers.10.mlp.weight", "layers.1"));
  CHECK_FALSE(MatchesModulePattern("model.layers.0.input_layernorm.weight", "norm"));
  CHECK_FALSE(MatchesModulePattern("model.normal.weight", "norm"));
  CHECK_FALSE(MatchesModulePattern("model.pre_norm.weight", "norm"));
  CHECK(MatchesModulePattern("a.wo.weight", "wo"));
  CHECK_FALSE(MatchesModulePattern("a.wo_x.weight", "wo"));
  CHECK_FALSE(MatchesModulePattern("anything", ""));
}

// fp32 tensors: norm.weight (10), input_layernorm.weight (10), normal.weight (10), an int64
// buffer norm.count (1); as float16 they plan at 2 bytes unless kept in fp32.
Json Tree() {
  Json norm = Module("norm", "Norm", Json::array({Tensor("weight", {10})}), Json::array(),
                     Json::array({Tensor("count", {1}, "int64")}));
  Json inorm = Module("input_layernorm", "Norm", Json::array({Tensor("weight", {10})}));
  Json normal = Module("normal", "Linear", Json::array({Tensor("weight", {10})}));
  return testing::Sequential(Json::array({norm, inorm, normal}));
}

uint64_t PlannedBytes(std::optional<DType> dtype, std::vector<std::string> keep) {
  Json doc = testing::Doc(Tree(), {{"cpu", 100000}});
  DevicePlan plan = testing::PlanDoc(doc, [&](DeviceMapOptions& o) {
    o.dtype = dtype;
    o.keep_in_fp32 = keep;
  });
  uint64_t total = 0;
  for (const DeviceUsage& u : plan.usage) total += u.bytes;
  return total;
}

TEST_CASE("keep_in_fp32: planned sizes use float32 for matching float tensors", "[planner][fp32]") {
  CHECK(PlannedBytes(std::nullopt, {}) == 3 * 40 + 8);
  CHECK(PlannedBytes(DType::kF16, {}) == 3 * 20 + 8);
  CHECK(PlannedBytes(DType::kF16, {"norm"}) == 40 + 20 + 20 + 8);  // only norm.weight; int64 stays
  CHECK(PlannedBytes(DType::kBF16, {"norm"}) == 40 + 20 + 20 + 8);
  CHECK(PlannedBytes(DType::kF8E4M3, {"norm", "normal"}) == 40 + 10 + 40 + 8);
  CHECK(PlannedBytes(DType::kF32, {"norm"}) == 3 * 40 + 8);     // not a reduced dtype: no change
  CHECK(PlannedBytes(std::nullopt, {"norm"}) == 3 * 40 + 8);    // no target dtype: no change
  CHECK(PlannedBytes(DType::kF16, {"norm.weight"}) == 40 + 20 + 20 + 8);  // a run of components
}

TEST_CASE("dtype policy: special dtypes win, ints and bools keep their size, fractional sizes",
          "[planner][fp32]") {
  Json bools = Module("mask", "Mask", Json::array(), Json::array(),
                      Json::array({Tensor("m", {3}, "bool"), Tensor("q", {5}, "int4")}));
  Json lin = Module("lin", "Linear", Json::array({Tensor("weight", {4}, "float16"), Tensor("bias", {4})}));
  Json doc = testing::Doc(testing::Sequential(Json::array({lin, bools})), {{"cpu", 100000}});
  DevicePlan plan = testing::PlanDoc(doc, [](DeviceMapOptions& o) {
    o.dtype = DType::kF32;
    o.special_dtypes = {{"lin.bias", DType::kF64}, {"norm", DType::kF64}};
  });
  // lin.weight stays 2 bytes (min with f32), lin.bias 8 bytes (special), 3 bools = 0.375,
  // 5 int4 = 2.5: 8 + 32 + 2.875 = 42.875, rounded up.
  REQUIRE(plan.usage.size() == 1);
  CHECK(plan.usage[0].bytes == 43);
}

}  // namespace
}  // namespace loadstone
