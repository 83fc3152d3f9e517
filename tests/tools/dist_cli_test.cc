// `loadstone launch -n N -- load MODEL --tp N` and `load --world-size/--rank/--master`, run as a
// person runs them: every rank's tensors (CRC-32 per part) against the parts transformers gives
// each rank (tests/fixtures/tp/cases.json), the bytes each rank read, errors and the launcher's
// bound. Ranks meet on 127.0.0.1 only.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/tp_cases.h"
#include "tools/cli_runner.h"

namespace loadstone {
namespace {

const std::string kLlama = testing::kTpModels + "llama";

// The CRC-32 of rank r of `world`'s part of `param` (its elements are their own indices), as
// f32 or, with bf16, the top halves (exact: every index is below 256).
uint32_t ExpectedCrc(const nlohmann::json& param, int world, int r, bool bf16) {
  std::vector<unsigned char> bytes;
  for (uint64_t i : testing::TpIndices(param, world, r)) {
    const float f = static_cast<float>(i);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int b = bf16 ? 2 : 0; b < 4; ++b) bytes.push_back((bits >> (8 * b)) & 0xFF);
  }
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), bytes.data(), bytes.size()));
}

void CheckRanks(const nlohmann::json& doc, int world, bool bf16) {
  const nlohmann::json& model = testing::TpCase("llama");
  REQUIRE(doc["ranks"].size() == static_cast<size_t>(world));
  uint64_t read = 0;
  for (int r = 0; r < world; ++r) {
    const auto& rank = doc["ranks"][r];
    INFO("rank " << r << " of " << world);
    REQUIRE(rank.is_object());
    CHECK(rank["rank"] == r);
    CHECK(rank["requested_bytes"] == rank["share_read_bytes"]);  // the reader's count
    CHECK(rank["read_bytes"] >= rank["requested_bytes"]);  // O_DIRECT: whole blocks
    read += rank["requested_bytes"].get<uint64_t>();
    std::map<std::string, uint32_t> crcs;
    for (const auto& t : rank["tensors"]) crcs[t["name"]] = t["crc32"];
    REQUIRE(crcs.size() == model["parameters"].size());
    for (const auto& param : model["parameters"]) {
      INFO(param["name"]);
      CHECK(crcs[param["name"]] == ExpectedCrc(param, world, r, bf16));
    }
  }
  const auto& first = doc["ranks"][0];
  CHECK(read == first["split_bytes"].get<uint64_t>() +
                    world * first["replicated_bytes"].get<uint64_t>());
}

TEST_CASE("launch: 2 and 4 ranks each hold transformers' part, and read only their share") {
  for (int world : {2, 4}) {
    const auto run = testing::RunCli("launch -n " + std::to_string(world) + " -- load " + kLlama +
                                     " --tp " + std::to_string(world) + " --json");
    INFO(run.err);
    REQUIRE(run.code == 0);
    CheckRanks(nlohmann::json::parse(run.out), world, /*bf16=*/false);
  }
  const auto run = testing::RunCli("launch -n 2 -- load " + kLlama + " --tp 2 --dtype bf16 --json");
  INFO(run.err);
  REQUIRE(run.code == 0);
  CheckRanks(nlohmann::json::parse(run.out), 2, /*bf16=*/true);
}

TEST_CASE("load --world-size/--rank/--master by hand, and what a person gets wrong") {
  auto run = testing::RunCli("load " + kLlama + " --tp 3 --world-size 4 --rank 0");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("degree divides the world size"));
  run = testing::RunCli("load " + kLlama + " --tp 2 --master localhost");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("--master localhost: give ADDRESS:PORT"));
  run = testing::RunCli("load " + kLlama + " --tp 2 --trace /tmp/never.json");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("--trace with a tensor-parallel load"));
  run = testing::RunCli("launch -n 2 -- load " + kLlama + " --tp 2 --tp-plan /nonexistent.json");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("[rank 1] error: NotFound: --tp-plan /nonexistent.json"));
  // A world of 3 with 2 ranks started: rank 2 never comes; the launcher's bound ends it.
  run = testing::RunCli("launch -n 2 --timeout 3 -- load " + kLlama + " --tp 1 --world-size 3");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("did not all end within --timeout 3 s: all were killed"));
  // The ranks' own bound, without the launcher's: each fails, naming where it waited.
  run = testing::RunCli("launch -n 2 -- load " + kLlama +
                        " --tp 1 --world-size 3 --dist-timeout 2");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("[rank 0] error: IOError: rank 0 of 3 meeting at 127.0.0.1"));
}

}  // namespace
}  // namespace loadstone
