// Every --json document is what docs/cli.md says it is: each field the CLI prints is documented
// with its type, and each documented field not marked optional is printed.
#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/writer.h"
#include "tests/tools/cli_runner.h"

namespace loadstone {
namespace {

using nlohmann::json;
using testing::RunCli;
using testing::TempDir;

struct Field {
  std::vector<std::string> path;  // "tensors[]", "name"; "<device>" matches any key
  std::set<std::string> types;    // integer, number, string, boolean, array, object, null
  bool optional = false;
};

std::vector<std::string> Split(const std::string& dotted) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    out.push_back(dotted.substr(start, dot == std::string::npos ? dot : dot - start));
    if (dot == std::string::npos) return out;
    start = dot + 1;
  }
}

// The table after "<!-- json-fields: NAME -->" in docs/cli.md.
std::vector<Field> Documented(const std::string& name) {
  const std::string doc = testing::Slurp(std::string(LOADSTONE_SOURCE_DIR) + "/docs/cli.md");
  const size_t at = doc.find("<!-- json-fields: " + name + " -->");
  REQUIRE(at != std::string::npos);
  std::vector<Field> fields;
  const std::regex row(R"(^\| `([^`]+)` \| ([a-z ]+) \|(.*)\|$)");
  size_t line_start = doc.find('\n', at) + 1;
  while (line_start < doc.size() && doc[line_start] == '|') {
    const size_t end = doc.find('\n', line_start);
    const std::string line = doc.substr(line_start, end - line_start);
    line_start = end + 1;
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;  // the header and the rule
    Field f;
    f.path = Split(m[1]);
    std::string types = m[2];
    for (size_t p; (p = types.find(" or ")) != std::string::npos;) {
      f.types.insert(types.substr(0, p));
      types = types.substr(p + 4);
    }
    while (!types.empty() && types.back() == ' ') types.pop_back();
    f.types.insert(types);
    f.optional = std::string(m[3]).find("(optional") != std::string::npos;
    fields.push_back(f);
  }
  REQUIRE(fields.size() >= 5);
  return fields;
}

std::string TypeOf(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

bool SegmentMatches(const std::string& documented, const std::string& printed) {
  return documented == printed || (documented.front() == '<' && documented.back() == '>');
}

const Field* Find(const std::vector<Field>& fields, const std::vector<std::string>& path) {
  for (const Field& f : fields) {
    if (f.path.size() != path.size()) continue;
    bool all = true;
    for (size_t i = 0; i < path.size() && all; ++i) all = SegmentMatches(f.path[i], path[i]);
    if (all) return &f;
  }
  return nullptr;
}

// Every leaf (and every documented object or null) of `v`, checked against `fields`;
// documented fields seen go to *seen.
void Walk(const json& v, std::vector<std::string> path, const std::vector<Field>& fields,
          std::set<const Field*>* seen) {
  const Field* f = path.empty() ? nullptr : Find(fields, path);
  if (f) {
    seen->insert(f);
    INFO("field " << nlohmann::json(path).dump());
    CHECK(f->types.count(TypeOf(v)) == 1);
  }
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      path.push_back(key);
      Walk(value, path, fields, seen);
      path.pop_back();
    }
    return;
  }
  if (v.is_array() && !v.empty() && v.front().is_object()) {
    std::string& last = path.back();
    last += "[]";
    for (const json& item : v) Walk(item, path, fields, seen);
    return;
  }
  INFO("printed but not documented: " << nlohmann::json(path).dump());
  CHECK(f != nullptr);
}

void CheckAgainstDocs(const std::string& name, const std::vector<std::string>& outputs) {
  const std::vector<Field> fields = Documented(name);
  std::set<const Field*> seen;
  for (const std::string& out : outputs) {
    INFO(name << ": " << out.substr(0, 400));
    const json doc = json::parse(out);
    REQUIRE(doc.is_object());
    Walk(doc, {}, fields, &seen);
  }
  for (const Field& f : fields) {
    INFO(name << ": documented but never printed: " << nlohmann::json(f.path).dump());
    if (!f.optional) CHECK(seen.count(&f) == 1);
  }
}

struct Model {
  TempDir dir;
  std::string path;
  Model() {
    static const std::vector<std::byte> w(256 * 256 * 2), f8(256 * 256), scales(16);
    std::vector<TensorToWrite> t = {
        {"model.layers.0.w", DType::kBF16, {256, 256}, w, {}},
        {"model.layers.1.w", DType::kBF16, {256, 256}, w, {}},
        {"model.layers.1.fp8.weight", DType::kF8E4M3, {256, 256}, f8, {}},
        {"model.layers.1.fp8.weight_scale_inv", DType::kF32, {2, 2}, scales, {}},
    };
    path = dir.Path("model");
    REQUIRE(WriteShardedSafetensors(path, t, {.max_shard_size = 200'000}).ok());
    dir.Write("model/config.json",
              R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  }
};

TEST_CASE("cli json: inspect, plan and load print what docs/cli.md documents", "[tools][docs]") {
  Model m;
  TempDir dir;
  std::vector<std::byte> four(4);
  REQUIRE(WriteSafetensors(dir.Path("meta.safetensors"), {{"w", DType::kF32, {1}, four, {}}},
                           {{"format", "pt"}}).ok());
  const auto inspect = RunCli("inspect " + m.path + " --json");
  const auto inspect_meta = RunCli("inspect " + dir.Path("meta.safetensors") + " --json");
  REQUIRE(inspect.code == 0);
  REQUIRE(inspect_meta.code == 0);
  CheckAgainstDocs("inspect", {inspect.out, inspect_meta.out});

  const std::string description = dir.Write("model.json", R"({"modules": {"class": "M", "params": [
      {"name": "a", "shape": [100], "dtype": "float32"}, {"name": "b", "shape": [100], "dtype": "float32"}]},
      "max_memory": {"0": 500, "cpu": 10000}})");
  const auto plan = RunCli("plan " + m.path + " --device-map sequential --max-memory 0=200KiB,cpu=1GiB --json");
  const auto described = RunCli("plan --model-json " + description + " --json --explain");
  // A .bin that goes partly to disk (tests/fixtures/offload/): the disk fields.
  const std::string offload_bin =
      std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/offload/model/pytorch_model.bin";
  const auto disk_plan = RunCli("plan " + offload_bin + " --device-map auto --max-memory cpu=25000 "
                                "--offload-folder " + dir.Path("offload") + " --json");
  // A GGUF file whose blocks --dtype dequantizes: the quantized fields.
  const std::string blocks =
      std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/dequant/blocks.gguf";
  const auto quantized_plan = RunCli("plan " + blocks + " --dtype bf16 --json");
  REQUIRE(plan.code == 0);
  REQUIRE(described.code == 0);
  REQUIRE(disk_plan.code == 0);
  REQUIRE(quantized_plan.code == 0);
  CheckAgainstDocs("plan", {plan.out, described.out, disk_plan.out, quantized_plan.out});

  const auto load = RunCli("load " + m.path + " --dtype bf16 --json");
  const auto mapped = RunCli("load " + m.path + " --mmap --json");
  const auto disk_load = RunCli("load " + offload_bin + " --device-map auto --max-memory cpu=25000 "
                                "--offload-folder " + dir.Path("offload") + " --json");
  REQUIRE(load.code == 0);
  REQUIRE(mapped.code == 0);
  REQUIRE(disk_load.code == 0);
  CheckAgainstDocs("load", {load.out, mapped.out, disk_load.out});
  // The times are one clock's, from the Open call: the first tensor after opening and planning,
  // and first_tensor_ms the earliest ready_ms.
  for (const std::string& out : {load.out, mapped.out}) {
    const auto doc = nlohmann::json::parse(out);
    const double open_ms = doc["open_ms"].get<double>();
    const double plan_ms = doc["plan_ms"].get<double>();
    CHECK(open_ms > 0);
    CHECK(plan_ms > 0);
    double earliest = 1e300;
    for (const auto& t : doc["tensors"]) earliest = std::min(earliest, t["ready_ms"].get<double>());
    CHECK(earliest >= open_ms + plan_ms);
    CHECK(doc["first_tensor_ms"].get<double>() == earliest);
  }
}

TEST_CASE("cli json: inspect of .bin and GGUF files, and convert, print what docs/cli.md documents",
          "[tools][docs]") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/";
  const auto bin = RunCli("inspect " + fixtures + "torch/views.bin --json");
  const auto big_endian = RunCli("inspect " + fixtures + "torch/big_endian.bin --json");
  const auto gguf = RunCli("inspect " + fixtures + "gguf/quantized.gguf --json");
  REQUIRE(bin.code == 0);
  REQUIRE(big_endian.code == 0);
  REQUIRE(gguf.code == 0);
  CheckAgainstDocs("inspect", {bin.out, big_endian.out, gguf.out});
  TempDir dir;
  const auto file = RunCli("convert " + fixtures + "torch/plain.bin " + dir.Path("a.safetensors") + " --json");
  const auto folder = RunCli("convert " + fixtures + "torch/sharded " + dir.Path("b") +
                             " --dtype bf16 --max-shard-size 100 --json");
  REQUIRE(file.code == 0);
  REQUIRE(folder.code == 0);
  CheckAgainstDocs("convert", {file.out, folder.out});
}

#ifdef LOADSTONE_TEST_DIST
TEST_CASE("cli json: a tensor-parallel rank's load prints what docs/cli.md documents",
          "[tools][docs]") {
  const auto run = RunCli("launch -n 2 -- load " + std::string(LOADSTONE_SOURCE_DIR) +
                          "/tests/fixtures/tp/models/llama --tp 2 --json");
  INFO(run.err);
  REQUIRE(run.code == 0);
  const json doc = json::parse(run.out);
  REQUIRE(doc["ranks"].size() == 2);
  CheckAgainstDocs("load-rank", {doc["ranks"][0].dump(), doc["ranks"][1].dump()});
}
#endif

TEST_CASE("cli json: bench prints what docs/cli.md documents", "[tools][docs]") {
  Model m;
  const auto bench = RunCli("bench " + m.path + " --repeat 1 --settle 0 --json");
  INFO(bench.err);
  REQUIRE(bench.code == 0);
  CheckAgainstDocs("bench", {bench.out});
}

}  // namespace
}  // namespace loadstone
