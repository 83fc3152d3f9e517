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

// The launcher's document of `world` ranks in tensor-parallel groups of `tp` and `pp` stages of
// the 2-layer llama fixture: stage 0 holds the embeddings and layer 0, stage 1 layer 1, the norm
// and the head (vLLM's split, written out here).
// `once`: read once (every rank's document says so), as --read-once or as --read-mode auto chose.
void CheckRanks(const nlohmann::json& doc, int world, bool bf16, int tp = 0, int pp = 1,
                bool once = false) {
  if (tp == 0) tp = world;
  const nlohmann::json& model = testing::TpCase("llama");
  REQUIRE(doc["ranks"].size() == static_cast<size_t>(world));
  auto stage_of = [pp](const std::string& name) {
    const bool first = name.starts_with("model.embed_tokens.") ||
                       name.starts_with("model.layers.0.");
    return pp == 1 || first ? 0 : 1;
  };
  uint64_t read = 0;
  uint64_t bound = 0;
  for (int r = 0; r < world; ++r) {
    const auto& rank = doc["ranks"][r];
    const int stage = (r / tp) % pp;
    INFO("rank " << r << " of " << world);
    REQUIRE(rank.is_object());
    CHECK(rank["rank"] == r);
    CHECK(rank["stage"] == stage);
    if (pp == 2) CHECK(rank["layers"] == nlohmann::json::array({stage, stage + 1}));
    CHECK(rank["requested_bytes"] == rank["share_read_bytes"]);  // the reader's count
    CHECK(rank["read_bytes"] >= rank["requested_bytes"]);  // O_DIRECT: whole blocks
    read += rank["requested_bytes"].get<uint64_t>();
    CHECK(rank["read_mode"] == (once ? "once" : "each"));
    if (once && r % tp != 0) CHECK(rank["requested_bytes"] == 0);
    if (r % tp == 0) {
      bound += rank["split_bytes"].get<uint64_t>() +
               (once ? 1 : tp) * rank["replicated_bytes"].get<uint64_t>();
    }
    std::map<std::string, uint32_t> crcs;
    for (const auto& t : rank["tensors"]) crcs[t["name"]] = t["crc32"];
    size_t on_stage = 0;
    for (const auto& param : model["parameters"]) {
      const std::string name = param["name"];
      INFO(name);
      if (stage_of(name) != stage) {
        CHECK(crcs.count(name) == 0);
        continue;
      }
      ++on_stage;
      CHECK(crcs[name] == ExpectedCrc(param, tp, r % tp, bf16));
    }
    CHECK(crcs.size() == on_stage);
  }
  // Split tensors once, replicated ones by each rank of their stage (read once: by its first).
  CHECK(read == bound);
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

TEST_CASE("launch: tensor x pipeline parallel, 4 ranks as 2 stages of 2") {
  auto run = testing::RunCli("launch -n 4 -- load " + kLlama + " --pp 2 --json");
  INFO(run.err);
  REQUIRE(run.code == 0);
  CheckRanks(nlohmann::json::parse(run.out), 4, /*bf16=*/false, /*tp=*/2, /*pp=*/2);
  run = testing::RunCli("launch -n 2 -- load " + kLlama + " --pp 2 --pp-layers 1,1");
  INFO(run.out);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.out, Catch::Contains("[rank 1] rank 1 of 2 (tensor-parallel rank 0 of 1, "
                                      "stage 1 of 2: layers 1..1, reading each its own)"));
  run = testing::RunCli("launch -n 2 -- load " + kLlama + " --pp 2 --pp-layers 2,1");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("give one count per stage (--pp-layers), adding up to 2"));
  run = testing::RunCli("load " + kLlama + " --pp-layers 1,1");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("give --tp or --pp"));
}

TEST_CASE("launch: read once, and a mode chosen from measured bandwidths") {
  auto run = testing::RunCli("launch -n 4 -- load " + kLlama + " --tp 4 --read-once --json");
  INFO(run.err);
  REQUIRE(run.code == 0);
  CheckRanks(nlohmann::json::parse(run.out), 4, /*bf16=*/false, 4, 1, /*once=*/true);
  run = testing::RunCli("launch -n 4 -- load " + kLlama + " --pp 2 --read-mode auto --json");
  REQUIRE(run.code == 0);
  const auto doc = nlohmann::json::parse(run.out);
  const bool once = doc["ranks"][0]["read_mode"] == "once";
  CheckRanks(doc, 4, /*bf16=*/false, 2, 2, once);
  for (const auto& rank : doc["ranks"]) {
    CHECK(rank["measured_read_bytes_per_s"].get<double>() > 0);
    CHECK(rank["measured_link_bytes_per_s"].get<double>() > 0);
    // The mode taken is the one the model estimated faster.
    CHECK(once == (rank["estimated_once_seconds"].get<double>() <
                   rank["estimated_each_seconds"].get<double>()));
  }
  CHECK(doc["ranks"][0]["probe_bytes"].get<uint64_t>() > 0);  // a group's first rank measured
  CHECK(doc["ranks"][1]["probe_bytes"] == 0);
  run = testing::RunCli("load " + kLlama + " --read-mode sometimes --tp 2");
  CHECK(run.code != 0);
  CHECK_THAT(run.err, Catch::Contains("--read-mode"));
}

TEST_CASE("launch: expert parallel, each rank holds and reads only its experts") {
  const std::string moe = testing::kTpModels + "qwen3-moe";
  auto run = testing::RunCli("launch -n 2 -- load " + moe + " --tp 2 --json");
  INFO(run.err);
  REQUIRE(run.code == 0);
  std::map<std::string, uint32_t> whole;  // without --ep every rank holds every expert
  const auto replicated = nlohmann::json::parse(run.out);
  for (const auto& t : replicated["ranks"][0]["tensors"]) {
    whole[t["name"]] = t["crc32"];
  }
  run = testing::RunCli("launch -n 2 -- load " + moe + " --tp 2 --ep --json");
  REQUIRE(run.code == 0);
  const auto doc = nlohmann::json::parse(run.out);
  const nlohmann::json& held = testing::EpCase("qwen3-moe")["worlds"]["2"];
  uint64_t read = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& rank = doc["ranks"][r];
    INFO("rank " << r);
    CHECK(rank["expert_parallel"] == true);
    CHECK(rank["expert_bytes"].get<uint64_t>() > 0);
    CHECK(rank["requested_bytes"] == rank["share_read_bytes"]);
    read += rank["requested_bytes"].get<uint64_t>();
    REQUIRE(rank["tensors"].size() == held[r].size());  // transformers' tensors, no more
    size_t experts = 0;
    for (const auto& t : rank["tensors"]) {
      const std::string name = t["name"];
      INFO(name);
      CHECK(held[r].contains(name));
      if (t["style"] != "grouped_gemm") continue;
      ++experts;
      CHECK(t["crc32"] == whole[name]);  // one expert's tensor, whole
    }
    CHECK(experts == 2 * 2 * 3);  // 2 layers × 2 experts × gate, up, down
  }
  CHECK(read == doc["ranks"][0]["split_bytes"].get<uint64_t>() +
                    2 * doc["ranks"][0]["replicated_bytes"].get<uint64_t>());
  run = testing::RunCli("launch -n 3 -- load " + moe + " --tp 3 --ep");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("do not split evenly over 3 expert-parallel ranks"));
  run = testing::RunCli("load " + moe + " --tp 1 --ep");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("give --tp 2 or more"));
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
  // A store that does not answer: rank 1 alone, rank 0's store never started.
  run = testing::RunCli("load " + kLlama +
                        " --world-size 2 --rank 1 --master 127.0.0.1:9 --dist-timeout 2");
  CHECK(run.code == 1);
  CHECK_THAT(run.err, Catch::Contains("rank 1 of 2 meeting at 127.0.0.1:9"));
}

}  // namespace
}  // namespace loadstone
