// Hostile inputs to planning: every class ends in one clean error, or a correct result, with
// work and memory linear in the input (CTest's timeout guards against a stall; no timing here).
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "io/formats/limits.h"
#include "loadstone/writer.h"
#include "device_map_test_util.h"
#include "runtime/device_map/module_tree.h"
#include "runtime/device_map/no_split.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

using testing::Json;

std::string Nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']');
}

Json Params(int n) {
  Json children = Json::array();
  for (int i = 0; i < n; ++i) {
    children.push_back(testing::Module(fmt::format("m{}", i), "Block",
                                       Json::array({testing::Tensor("w", {4})})));
  }
  return children;
}

Result<ModelDescription> Describe(const Json& doc) { return ParseModelDescription(doc.dump()); }

TEST_CASE("hostile: a model description with a number beyond double's range") {
  auto d = ParseModelDescription(
      R"({"modules": {"params": [{"name": "w", "shape": [2], "dtype": "float32"}]},
          "max_memory": {"cpu": 1e500}})");
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == StatusCode::kCorruption);
  CHECK(d.status().message().find("number overflow parsing '1e500'") != std::string_view::npos);
}

TEST_CASE("hostile: modules nested past the JSON bound") {
  Json inner = testing::Module("leaf", "Leaf", Json::array({testing::Tensor("w", {1})}));
  for (int i = 0; i < 200; ++i) inner = testing::Module("c", "C", Json::array(), Json::array({inner}));
  auto d = Describe(Json{{"modules", inner}});
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("more than 256 deep") != std::string_view::npos);
  // 100 levels fit (two JSON levels a module) and build, iteratively.
  Json ok = testing::Module("leaf", "Leaf", Json::array({testing::Tensor("w", {1})}));
  for (int i = 0; i < 100; ++i) ok = testing::Module("c", "C", Json::array(), Json::array({ok}));
  auto built = Describe(Json{{"modules", testing::Module("", "Root", Json::array(), Json::array({ok}))}});
  REQUIRE(built.ok());
  CHECK(built->tree.num_modules() == 102);  // the root, 100 levels, the leaf
}

TEST_CASE("hostile: a tied group larger than a description may tie") {
  Json tied = Json::array();
  for (int i = 0; i < 20'000; ++i) tied.push_back(fmt::format("m{}.w", i));
  auto d = Describe(Json{{"modules", {{"children", Params(20'000)}}}, {"tied", Json::array({tied})}});
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message() ==
        "model description: \"tied\" names 20000 tensors, more than the 4096 a description may tie");
}

TEST_CASE("hostile: one tied group of 4000 names plans as one storage, in linear time") {
  Json tied = Json::array();
  for (int i = 0; i < 4000; ++i) tied.push_back(fmt::format("m{}.w", i));
  auto d = Describe(Json{{"modules", {{"children", Params(6000)}}}, {"tied", Json::array({tied})}});
  REQUIRE(d.ok());
  DeviceMapOptions o = d->options;
  o.device_map = "sequential";
  o.max_memory = MaxMemory{{"0", int64_t{100}}, {"cpu", int64_t{1'000'000}}};
  auto plan = InferDeviceMap(d->tree, o);
  REQUIRE(plan.ok());
  // The tied storage counts once (16 bytes); the 2000 untied blocks 16 bytes each.
  uint64_t total = 0;
  for (const DeviceUsage& u : plan->usage) total += u.bytes;
  CHECK(total == 16 * (1 + 2000));
  // m0 and every name tied to it share one device.
  const auto device_of_m0 = plan->device_map.Lookup("m0.w");
  REQUIRE(device_of_m0);
  for (int i = 0; i < 4000; i += 997) {
    CHECK(plan->device_map.Lookup(fmt::format("m{}.w", i)) == device_of_m0);
  }
}

TEST_CASE("hostile: a tensor name past the planner's name bounds") {
  testing::TempDir dir;
  std::vector<std::byte> four(4);
  // Longer than any tensor name may be: the catalog refuses it (io/formats/limits.h).
  std::string long_name;
  for (int i = 0; i < 100'000; ++i) long_name += i ? ".a" : "a";
  REQUIRE(WriteSafetensors(dir.Path("long.safetensors"), {{long_name, DType::kF32, {1}, four, {}}})
              .ok());
  const auto refused = Checkpoint::Open(dir.Path("long.safetensors"));
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("kMaxTensorNameBytes"));
  // Short enough, but deeper than the planner's module tree goes.
  std::string deep;
  for (size_t i = 0; i <= device_map::kMaxNameDepth; ++i) deep += i ? ".a" : "a";
  REQUIRE(WriteSafetensors(dir.Path("deep.safetensors"), {{deep, DType::kF32, {1}, four, {}}}).ok());
  auto ckpt = Checkpoint::Open(dir.Path("deep.safetensors"));
  REQUIRE(ckpt.ok());
  auto tree = ModuleTree::FromCheckpoint(*ckpt);
  REQUIRE_FALSE(tree.ok());
  CHECK(tree.status().code() == StatusCode::kInvalidArgument);
  CHECK(tree.status().message().find("257 bytes in 129 dotted components, more than the "
                                     "device-map planner takes (4096 bytes, 128 components)") !=
        std::string_view::npos);
  // Within the bounds, a deep name builds: one copy of it, its modules views of its prefixes.
  std::string ok;
  for (size_t i = 0; i + 1 < device_map::kMaxNameDepth; ++i) ok += i ? ".a" : "a";
  REQUIRE(WriteSafetensors(dir.Path("ok.safetensors"), {{ok, DType::kF32, {1}, four, {}}}).ok());
  auto ok_tree = ModuleTree::FromCheckpoint(*Checkpoint::Open(dir.Path("ok.safetensors")));
  REQUIRE(ok_tree.ok());
  CHECK(ok_tree->num_modules() == device_map::kMaxNameDepth - 1);
  const auto& impl = ModuleTreeAccess::Get(*ok_tree);
  CHECK(impl.nodes.back().name.data() == impl.tensors.back().name.data());  // a view, not a copy
}

TEST_CASE("hostile: a device-map lookup of a deep name probes only the keys' lengths") {
  std::string deep;
  for (int i = 0; i < 100'000; ++i) deep += i ? ".a" : "a";
  DeviceMap cpu;
  REQUIRE(cpu.Add("", Device::Cpu()).ok());
  CHECK(cpu.Lookup(deep) == Device::Cpu());  // one probe, not 100,000 prefixes hashed
  DeviceMap map;
  REQUIRE(map.Add("a.a", Device::Cuda(0)).ok());
  REQUIRE(map.Add("a.a.a.b", Device::Cuda(1)).ok());
  REQUIRE(map.Add("b", Device::Disk()).ok());
  CHECK(map.Lookup(deep) == Device::Cuda(0));
  CHECK(map.Lookup("a.a.a.b.x") == Device::Cuda(1));
  CHECK(map.Lookup("a.a.a.bx") == Device::Cuda(0));  // "a.a.a.b" is not a dotted prefix of it
  CHECK(map.Lookup("a.ab") == std::nullopt);
  CHECK(map.Lookup("b") == Device::Disk());
  CHECK(map.Lookup("") == std::nullopt);
  REQUIRE(map.Add("", Device::Cpu()).ok());
  CHECK(map.Lookup("a.ab") == Device::Cpu());
}

TEST_CASE("hostile: a description name past the bound") {
  Json m = testing::Module(std::string(5000, 'x'), "C", Json::array({testing::Tensor("w", {1})}));
  auto d = Describe(Json{{"modules", {{"children", Json::array({m})}}}});
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("more than the planner takes (4096 bytes") != std::string_view::npos);
}

TEST_CASE("hostile: a model description file past kMaxModelDescriptionBytes, refused unread") {
  // A sparse file: its size is what the bound is checked against, before any byte is read.
  testing::TempDir dir;
  const std::string path = dir.Write("model.json", "{}");
  std::filesystem::resize_file(path, io::kMaxModelDescriptionBytes + 1);
  auto d = ReadModelDescription(path);
  REQUIRE_FALSE(d.ok());
  INFO(d.status().ToString());
  CHECK(d.status().code() == StatusCode::kUnsupported);
  const std::string msg(d.status().message());
  CHECK_THAT(msg, Catch::Contains("kMaxModelDescriptionBytes") && Catch::Contains(path) &&
                      Catch::Contains("io/formats/limits.h"));
}

TEST_CASE("hostile: globs run without recursion or backtracking blow-up") {
  const std::string name(20'000, 'a');
  std::string pattern;
  for (int i = 0; i < 200; ++i) pattern += "*a";
  CHECK(device_map::GlobMatch(pattern, name));
  CHECK_FALSE(device_map::GlobMatch(pattern + "b", name));
  CHECK(device_map::GlobMatch("model.layers.*", "model.layers.10"));
  CHECK_FALSE(device_map::GlobMatch("model.layers.*", "model.layers.10.mlp"));
  CHECK(device_map::GlobMatch("model.*.mlp", "model.3.mlp"));
  CHECK_FALSE(device_map::GlobMatch("model.*", "model.a.b"));
  CHECK(device_map::GlobMatch("h.[0-9]", "h.7"));
  CHECK_FALSE(device_map::GlobMatch("h.[!0-9]", "h.7"));
  CHECK(device_map::GlobMatch("a?c", "abc"));
  CHECK_FALSE(device_map::GlobMatch("a?c", "a.c"));
  CHECK_FALSE(device_map::GlobMatch("a[.]c", "a.c"));  // a class never takes a dot
  CHECK(device_map::GlobMatch("a[bc", "a[bc"));       // an unclosed class is literal
  CHECK(device_map::GlobMatch("**", ""));
  CHECK(device_map::GlobMatch("x*y*z", "xaaybbz"));
  CHECK_FALSE(device_map::GlobMatch("x*y*z", "xaaybb.z"));
}

TEST_CASE("json: a device map with hostile values, and plan --json's document") {
  auto big = DeviceMap::FromJson(R"({"a": 1e500})");
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().code() == StatusCode::kInvalidArgument);
  auto nested = DeviceMap::FromJson("{\"a\": " + Nested(1000) + "}");
  REQUIRE_FALSE(nested.ok());
  auto object = DeviceMap::FromJson(R"({"a": [[0]]})");
  REQUIRE_FALSE(object.ok());
  CHECK(object.status().message().find("not an array of 1 values") != std::string_view::npos);
  auto plan_doc = DeviceMap::FromJson(
      R"({"device_map": {"model.embed": 0, "lm_head": "cpu"}, "bytes_per_device": {"0": 1}})");
  REQUIRE(plan_doc.ok());
  CHECK(plan_doc->ToJson() == R"({"model.embed": 0, "lm_head": "cpu"})");
}

}  // namespace
}  // namespace loadstone
