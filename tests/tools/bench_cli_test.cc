// `loadstone bench --peers`: an external peer program is listed, run with the checkpoint's files,
// timed by what it reports, ranked only when it does loadstone's work, and reported (not
// retried, not fatal) when it fails.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loadstone/writer.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A peer program: "fast" reports 1 µs then 3 µs (faster than anything real), "views" (less
// work) 1 ns, "broken" dies with a traceback. Every run appends its arguments to runs.log.
constexpr const char* kPeer = R"(#!/bin/sh
here=$(dirname "$0")
case "$1" in
--list) echo 'import noise'
        echo '[{"name": "fast", "same_work": true}, {"name": "views", "same_work": false},'
        echo ' {"name": "broken", "same_work": true}]' ;;
--run) echo "$*" >> "$here/runs.log"
       case "$2" in
       fast) n=$(grep -c '^--run fast' "$here/runs.log"); echo 'warming up'
             if [ "$n" = 1 ]; then echo '{"seconds": 0.000001}'; else echo '{"seconds": 0.000003}'; fi ;;
       views) echo '{"seconds": 0.000000001}' ;;
       broken) echo 'Traceback: KeyError: boom' >&2; exit 1 ;;
       esac ;;
esac
)";

TEST_CASE("bench --peers: peers in the interleaved loop, same-work ranking, failures reported",
          "[tools][bench]") {
  testing::TempDir dir;
  std::vector<float> values(64 * 1024, 1.5f);
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back({.name = "layers." + std::to_string(i) + ".weight",
                       .dtype = DType::kF32,
                       .shape = {256, 256},
                       .data = std::as_bytes(std::span(values))});
  }
  auto shards = WriteShardedSafetensors(dir.Path("model"), tensors, {.max_shard_size = 600'000});
  REQUIRE(shards.ok());
  REQUIRE(shards->size() == 3);  // two shards and the index
  const std::string peer = dir.Write("peer.sh", kPeer);
  const std::string cmd = std::string(LOADSTONE_BINARY_DIR) + "/loadstone bench " +
                          dir.Path("model") + " --repeat 2 --settle 0 --json --peers 'sh " + peer +
                          "' >" + dir.Path("out") + " 2>" + dir.Path("err");
  const int status = std::system(cmd.c_str());
  INFO(Slurp(dir.Path("err")));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const auto doc = nlohmann::json::parse(Slurp(dir.Path("out")));
  const double bytes = doc["bytes"].get<double>();

  std::map<std::string, nlohmann::json> results;
  for (const auto& r : doc["results"]) results[r["method"].get<std::string>()] = r;
  REQUIRE(results.count("loadstone"));
  REQUIRE(results.count("raw-ceiling"));
  const auto& fast = results.at("fast");
  CHECK(fast["backend"] == "peer");
  CHECK(fast["same_work"] == true);
  CHECK(fast["seconds"] == nlohmann::json::array({1e-6, 3e-6}));
  CHECK(fast["gbps"].get<double>() == Approx(bytes / 2e-6 / 1e9));  // median of two: their mean
  CHECK(results.at("views")["same_work"] == false);
  const auto& broken = results.at("broken");
  CHECK(broken["seconds"].empty());
  CHECK(broken["error"].get<std::string>().find("KeyError: boom") != std::string::npos);

  // Each peer run got the checkpoint's shard files; the broken peer was not tried again.
  const std::string log = Slurp(dir.Path("runs.log"));
  const std::string files = (*shards)[0] + " " + (*shards)[1];
  CHECK(log.find("--run fast " + files + "\n") != std::string::npos);
  size_t broken_runs = 0;
  for (size_t at = 0; (at = log.find("--run broken", at)) != std::string::npos; ++at) ++broken_runs;
  CHECK(broken_runs == 1);

  // Every round runs every method once, in a shuffled order that its seed replays.
  REQUIRE(doc["order"].size() == 2);
  for (const auto& round : doc["order"]) {
    std::set<std::string> names(round.begin(), round.end());
    CHECK(names.size() == results.size());
    for (const auto& [name, r] : results) CHECK(names.count(name) == 1);
  }
  const std::string replay = std::string(LOADSTONE_BINARY_DIR) + "/loadstone bench " +
                             dir.Path("model") + " --repeat 2 --settle 0 --json --peers 'sh " +
                             peer + "' --seed " + doc["seed"].dump() + " >" + dir.Path("replay") +
                             " 2>/dev/null";
  REQUIRE(std::system(replay.c_str()) == 0);
  CHECK(nlohmann::json::parse(Slurp(dir.Path("replay")))["order"] == doc["order"]);

  // "views" is faster but does less work: the same-work best is "fast".
  const auto& ratios = doc["ratios"];
  CHECK(ratios["best_same_work"] == "fast");
  const double loadstone_gbps = results.at("loadstone")["gbps"].get<double>();
  CHECK(ratios["loadstone_vs_best_same_work"].get<double>() ==
        Approx(loadstone_gbps / fast["gbps"].get<double>()));
  CHECK(ratios["loadstone_vs_peer"]["broken"].is_null());
  CHECK(ratios["loadstone_vs_peer"]["views"].get<double>() < 1);
}

TEST_CASE("bench --peers: a program that lists no peers is a clear error", "[tools][bench]") {
  testing::TempDir dir;
  std::vector<float> values(16, 0.f);
  REQUIRE(WriteSafetensors(dir.Path("m.safetensors"),
                           {{.name = "w", .shape = {16}, .data = std::as_bytes(std::span(values))}})
              .ok());
  const std::string cmd =
      std::string(LOADSTONE_BINARY_DIR) + "/loadstone bench " + dir.Path("m.safetensors") +
      " --repeat 1 --settle 0 --peers 'sh -c true' 2>" + dir.Path("err") + " >/dev/null";
  const int status = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(status) != 0);
  CHECK(Slurp(dir.Path("err")).find("printed no JSON") != std::string::npos);
}

TEST_CASE("bench: a readable table at 80 columns, whole backends, each bound said for what it bounds",
          "[tools][bench]") {
  testing::TempDir dir;
  std::vector<std::byte> data(1 << 20, std::byte{0x3c});
  REQUIRE(WriteSafetensors(dir.Path("m.safetensors"),
                           {{"a.weight", DType::kBF16, {512, 1024}, data, {}}}).ok());
  const std::string bin = std::string(LOADSTONE_BINARY_DIR) + "/loadstone bench ";
  REQUIRE(std::system((bin + dir.Path("m.safetensors") + " --repeat 1 --settle 0 >" +
                       dir.Path("out") + " 2>/dev/null").c_str()) == 0);
  const std::string out = Slurp(dir.Path("out"));
  INFO(out);
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    if (line.find(dir.path()) == std::string::npos) CHECK(line.size() <= 79);  // paths aside
  }
  CHECK(out.find('{') == std::string::npos);  // no JSON blob
  CHECK(out.find("(userfaultfd)") != std::string::npos);  // a backend whole, its parenthesis too
  // Warm: the O_DIRECT read of the device is reported, and said to bound nothing.
  CHECK(out.find("machine bound: first touch (writing fresh pages)") != std::string::npos);
  CHECK(out.find("raw ceiling: the device with O_DIRECT (no bound: files are cached)") !=
        std::string::npos);
  REQUIRE(std::system((bin + dir.Path("m.safetensors") + " --repeat 1 --settle 0 --json >" +
                       dir.Path("json") + " 2>/dev/null").c_str()) == 0);
  const auto doc = nlohmann::json::parse(Slurp(dir.Path("json")));
  CHECK(doc["ratios"]["machine_bound"] == "first-touch");
  std::map<std::string, double> gbps;
  for (const auto& r : doc["results"]) gbps[r["method"]] = r["gbps"].get<double>();
  CHECK(doc["ratios"]["loadstone_vs_machine_bound"].get<double>() ==
        Approx(gbps["loadstone"] / gbps["first-touch"]));
}

}  // namespace
}  // namespace loadstone
