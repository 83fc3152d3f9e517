// The CLI on http:// addresses (nginx on 127.0.0.1 over the committed fixtures, started and
// stopped here): inspect and load print what they print for the local file, the backend line
// names the http reader and the read line the network bytes; a folder loads as the local one,
// and a folder with no weights is one clear error line; convert writes the bytes the local
// convert writes (config.json too); bench runs the methods that apply to remote files and
// refuses --cold.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "testing/nginx_server.h"
#include "testing/temp_dir.h"
#include "tests/tools/cli_runner.h"

namespace loadstone {
namespace {

using testing::RunCli;

const std::string kFixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures";

// nginx serving the fixtures, or nullptr after saying why the test is skipped.
std::unique_ptr<testing::NginxServer> Serve() {
  std::string why;
  auto server = testing::NginxServer::Start(kFixtures, &why);
  if (!server) WARN("skipped: " << why);
  return server;
}

TEST_CASE("cli: inspect and load take an http address and print what the local file gives",
          "[tools][cli][http]") {
  auto server = Serve();
  if (!server) return;
  for (const std::string file : {"safetensors/dtypes.safetensors", "gguf/quantized.gguf",
                                 "torch/parameters.bin"}) {
    INFO(file);
    const auto local = RunCli("inspect " + kFixtures + "/" + file + " --json");
    const auto remote = RunCli("inspect " + server->Url(file) + " --json");
    INFO(remote.err);
    REQUIRE(remote.code == 0);
    CHECK(nlohmann::json::parse(remote.out)["tensors"] ==
          nlohmann::json::parse(local.out)["tensors"]);

    const auto want = nlohmann::json::parse(RunCli("load " + kFixtures + "/" + file + " --json").out);
    const auto loaded = RunCli("load " + server->Url(file) + " --json");
    INFO(loaded.err);
    REQUIRE(loaded.code == 0);
    auto got = nlohmann::json::parse(loaded.out);
    auto expected = want["tensors"];
    for (auto* tensors : {&got["tensors"], &expected}) {
      for (auto& t : *tensors) t.erase("ready_ms");  // when, not what
    }
    CHECK(got["tensors"] == expected);  // names, dtypes, shapes, devices and CRC-32s
    CHECK(got["backend"].get<std::string>().find("http (libcurl") == 0);
    // Every byte read came over the network (no retries on loopback): at least what was read.
    uint64_t routed = 0;
    for (const auto& [route, counts] : got["routes"].items()) routed += counts["bytes"].get<uint64_t>();
    CHECK(got["read"]["network_bytes"].get<uint64_t>() >= routed);
    CHECK(got["read"]["network_bytes"].get<uint64_t>() > 0);
  }
}

TEST_CASE("cli: a folder behind an http address loads as the local folder, in network bytes",
          "[tools][cli][http]") {
  auto server = Serve();
  if (!server) return;
  const std::string folder = "safetensors/diffusers", flags = " --subfolder text_encoder";
  const auto want =
      nlohmann::json::parse(RunCli("load " + kFixtures + "/" + folder + flags + " --json").out);
  const auto loaded = RunCli("load " + server->Url(folder) + flags + " --json");
  INFO(loaded.err);
  REQUIRE(loaded.code == 0);
  auto got = nlohmann::json::parse(loaded.out);
  auto expected = want["tensors"];
  for (auto* tensors : {&got["tensors"], &expected}) {
    for (auto& t : *tensors) t.erase("ready_ms");
  }
  CHECK(got["tensors"] == expected);
  const auto human = RunCli("load " + server->Url(folder) + flags);
  INFO(human.out << human.err);
  REQUIRE(human.code == 0);
  CHECK(human.out.find("read: ") != std::string::npos);
  CHECK(human.out.find(" over the network (0 ranges retried)") != std::string::npos);

  const auto none = RunCli("load " + server->Url("safetensors/edge"));
  CHECK(none.code == 1);
  CHECK(none.err.starts_with("error: NotFound: no checkpoint at '" + server->Url("safetensors/edge")));
  CHECK(none.err.find("--variant") != std::string::npos);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_CASE("cli: convert and bench take an http folder", "[tools][cli][http]") {
  auto server = Serve();
  if (!server) return;
  testing::TempDir out;
  const auto local = RunCli("convert " + kFixtures + "/torch/sharded " + out.Path("local"));
  REQUIRE(local.code == 0);
  const auto remote = RunCli("convert " + server->Url("torch/sharded") + " " + out.Path("remote"));
  INFO(remote.err);
  REQUIRE(remote.code == 0);
  for (const char* name : {"model.safetensors", "config.json"}) {
    INFO(name);
    const std::string want = Slurp(out.Path("local/") + name);
    CHECK_FALSE(want.empty());
    CHECK(Slurp(out.Path("remote/") + name) == want);
  }
  CHECK(Slurp(out.Path("remote/config.json")) == Slurp(kFixtures + "/torch/sharded/config.json"));

  const auto bench =
      RunCli("bench " + server->Url("safetensors/sharded") + " --repeat 1 --settle 0 --json");
  INFO(bench.err);
  REQUIRE(bench.code == 0);
  const auto doc = nlohmann::json::parse(bench.out);
  CHECK(doc["mode"] == "remote");
  std::vector<std::string> methods;
  for (const auto& r : doc["results"]) methods.push_back(r["method"].get<std::string>());
  CHECK(methods == std::vector<std::string>{"loadstone", "first-touch"});  // no local baselines
  CHECK(doc["results"][0]["backend"].get<std::string>().find("http (libcurl") == 0);
  CHECK(doc["ratios"]["loadstone_vs_raw_ceiling"].is_null());
  const auto cold = RunCli("bench " + server->Url("safetensors/sharded") + " --cold");
  CHECK(cold.code == 1);
  CHECK(cold.err.find("is remote: --cold") != std::string::npos);
}

}  // namespace
}  // namespace loadstone
