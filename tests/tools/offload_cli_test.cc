// `loadstone load --device-map auto --max-memory cpu=SIZE --offload-folder F`: the folder holds
// what accelerate 1.2.1 writes for the same model, byte for byte (tests/fixtures/offload/
// expected/, written by accelerate's offload_weight + save_offload_index in
// make_offload_fixtures.py), the map is accelerate's, reloading F gives torch.load's tensors;
// without a folder a .bin fails with diffusers' message, and a safetensors file needs none.
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "tests/tools/cli_runner.h"

namespace loadstone::testing {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/offload";
const std::string kBin = kFixtures + "/model/pytorch_model.bin";
const std::string kSafetensors = kFixtures + "/model/model.safetensors";

nlohmann::ordered_json Manifest() {
  return nlohmann::ordered_json::parse(Slurp(kFixtures + "/manifest.json"));
}

// Each tensor's CRC-32 as torch.load gives it.
std::map<std::string, uint32_t> ManifestCrcs() {
  const auto manifest = Manifest();
  std::map<std::string, uint32_t> crc;
  for (const auto& t : manifest["tensors"]) crc[t["name"].get<std::string>()] = t["crc32"].get<uint32_t>();
  return crc;
}

std::string Budget() { return fmt::format("cpu={}", Manifest()["max_memory"]["cpu"].get<uint64_t>()); }

std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("plan: the device map is accelerate's and says what goes to disk", "[offload]") {
  TempDir dir;
  CliRun run = RunCli(fmt::format("plan {} --device-map auto --max-memory {} --offload-folder {} --json",
                                  kBin, Budget(), dir.Path("offload")));
  INFO(run.err);
  REQUIRE(run.code == 0);
  const auto doc = nlohmann::ordered_json::parse(run.out);
  CHECK(doc["device_map"] == Manifest()["device_map"]);
  CHECK(doc["bytes_per_device"].contains("cpu"));
  CHECK(doc["bytes_per_device"].contains("disk"));
  CHECK(doc["disk"].size() == 7);
  for (const auto& d : doc["disk"]) CHECK(d["in_place"] == false);
}

TEST_CASE("load --offload-folder writes what accelerate writes, byte for byte", "[offload]") {
  TempDir dir;
  const std::string folder = dir.Path("offload");
  CliRun run = RunCli(fmt::format("load {} --device-map auto --max-memory {} --offload-folder {} --json",
                                  kBin, Budget(), folder));
  INFO(run.err);
  REQUIRE(run.code == 0);
  const std::string expected = kFixtures + "/expected";
  REQUIRE(FilesIn(folder) == FilesIn(expected));
  for (const std::string& name : FilesIn(expected)) {
    INFO(name);
    CHECK(Slurp(folder + "/" + name) == Slurp(expected + "/" + name));
  }
  // load --json: what went to cpu and to disk, each disk tensor's CRC as a reload reads it.
  const auto doc = nlohmann::ordered_json::parse(run.out);
  CHECK(doc["devices"].contains("cpu"));
  CHECK(doc["devices"].contains("disk"));
  CHECK(doc["offload_folder"] == folder);
  const std::map<std::string, uint32_t> crc = ManifestCrcs();
  REQUIRE(doc["offloaded"].size() == 7);
  for (const auto& t : doc["offloaded"]) {
    INFO(t.dump());
    CHECK(t["crc32"].get<uint32_t>() == crc.at(t["name"].get<std::string>()));
    CHECK(t["in_place"] == false);
  }
  for (const auto& t : doc["tensors"]) CHECK(t["crc32"].get<uint32_t>() == crc.at(t["name"].get<std::string>()));

  // The folder is a checkpoint: reloading it gives torch.load's tensors, bit for bit.
  CliRun reload = RunCli(fmt::format("load {} --json", folder));
  INFO(reload.err);
  REQUIRE(reload.code == 0);
  const auto again = nlohmann::ordered_json::parse(reload.out);
  REQUIRE(again["tensors"].size() == 7);
  for (const auto& t : again["tensors"]) {
    INFO(t.dump());
    CHECK(t["crc32"].get<uint32_t>() == crc.at(t["name"].get<std::string>()));
  }
  // Without --json: the disk line.
  CliRun human = RunCli(fmt::format("load {} --device-map auto --max-memory {} --offload-folder {}",
                                    kBin, Budget(), dir.Path("again")));
  REQUIRE(human.code == 0);
  CHECK_THAT(human.out, Catch::Contains("disk: 7 tensors") && Catch::Contains("0 read in place") &&
                            Catch::Contains("7 written to"));
}

TEST_CASE("load --offload-folder merges into an existing index as accelerate does", "[offload]") {
  TempDir dir;
  const std::string folder = dir.Path("offload");
  dir.Write("offload/index.json",
            R"({"other.weight": {"dtype": "float32", "shape": [1]}, "head.w": {"dtype": "int8", "shape": [1]}})");
  CliRun run = RunCli(fmt::format("load {} --device-map auto --max-memory {} --offload-folder {}",
                                  kBin, Budget(), folder));
  INFO(run.err);
  REQUIRE(run.code == 0);
  const auto index = nlohmann::ordered_json::parse(Slurp(folder + "/index.json"));
  std::vector<std::string> keys;
  for (const auto& [k, v] : index.items()) keys.push_back(k);
  // dict.update: existing keys keep their place (head.w with its new value), new ones follow.
  REQUIRE(keys.size() == 8);
  CHECK(keys[0] == "other.weight");
  CHECK(keys[1] == "head.w");
  CHECK(index["head.w"]["dtype"] == "float32");
  CHECK(keys[2] == "blocks.1.w");
}

TEST_CASE("a .bin mapped to disk without a folder gets diffusers' error", "[offload]") {
  CliRun run = RunCli(fmt::format("load {} --device-map auto --max-memory {}", kBin, Budget()));
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("The current `device_map` had weights offloaded to the disk. "
                                      "Please provide an `offload_folder` for them.") &&
                          Catch::Contains("blocks.1"));
}

TEST_CASE("a safetensors checkpoint mapped to disk needs no folder: read in place", "[offload]") {
  CliRun run = RunCli(fmt::format("load {} --device-map auto --max-memory {} --json", kSafetensors, Budget()));
  INFO(run.err);
  REQUIRE(run.code == 0);
  const auto doc = nlohmann::ordered_json::parse(run.out);
  const std::map<std::string, uint32_t> crc = ManifestCrcs();
  REQUIRE_FALSE(doc["offloaded"].empty());
  for (const auto& t : doc["offloaded"]) {
    INFO(t.dump());
    CHECK(t["in_place"] == true);
    CHECK_THAT(t["where"].get<std::string>(), Catch::Contains("model.safetensors (in place"));
    CHECK(t["crc32"].get<uint32_t>() == crc.at(t["name"].get<std::string>()));
  }
  CHECK(doc["offload_folder"] == "");
}


TEST_CASE("GGUF blocks mapped to disk with a dtype are dequantized, then offloaded", "[offload]") {
  // expected.safetensors: the gguf package's own dequantization of each tensor, in float32
  // (tests/fixtures/make_gguf_dequant_fixtures.py).
  const std::string dequant = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/dequant";
  TempDir dir;
  const std::string folder = dir.Path("off");
  const auto run = RunCli("load " + dequant + "/blocks.gguf --device-map '{\"\": \"disk\"}' --dtype "
                          "f32 --offload-folder " + folder);
  INFO(run.err);
  REQUIRE(run.code == 0);
  const auto index = nlohmann::json::parse(Slurp(folder + "/index.json"));
  auto expected = Checkpoint::Open(dequant + "/expected.safetensors");
  REQUIRE(expected.ok());
  const std::string bytes = Slurp(dequant + "/expected.safetensors");
  size_t compared = 0;
  for (const auto& [name, entry] : index.items()) {
    INFO(name);
    const TensorInfo* want = expected->Find(name + ".f32");
    REQUIRE(want != nullptr);
    CHECK(entry["dtype"] == "float32");
    CHECK(entry["shape"].get<std::vector<uint64_t>>() == want->shape);  // elements, not blocks
    CHECK(Slurp(folder + "/" + name + ".dat") == bytes.substr(want->offset, want->nbytes));
    ++compared;
  }
  CHECK(compared == 20);
  // Without a dtype the blocks would lose their type in a numpy file: refused, saying so.
  const auto refused = RunCli("load " + dequant + "/blocks.gguf --device-map '{\"\": \"disk\"}' "
                              "--offload-folder " + dir.Path("raw"));
  CHECK(refused.code == 1);
  CHECK(refused.err.find("GGUF blocks dequantized with a dtype") != std::string::npos);
}

}  // namespace loadstone::testing
