// Tensor-parallel loading across processes over c10d (loadstone/dist.h): W forked ranks meet at a
// TCPStore on 127.0.0.1 and exchange over Gloo; each writes what it holds (per tensor: the
// values, as indices) to a file the parent checks against transformers' own parts
// (tests/fixtures/tp/cases.json). Faults: a rank that dies, a rank with another checkpoint —
// every other rank ends with an error within its timeout, none hangs (the parent kills what
// outlives a bound).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstone/dist.h"
#include "testing/fork_ranks.h"
#include "testing/temp_dir.h"
#include "testing/tp_cases.h"

namespace loadstone {
namespace {

const std::string& kModels = testing::kTpModels;

// What one rank does (in its own process): load its share, write a JSON report.
void RunRank(const std::string& model, int world, int rank, int port, uint64_t bucket_bytes,
             const std::string& out) {
  nlohmann::json report;
  GroupOptions g;
  g.world_size = world;
  g.rank = rank;
  g.master_port = port;
  g.timeout = std::chrono::seconds(8);
  auto groups = ProcessGroups::Connect(g, world);
  Status status = groups.status();
  if (status.ok()) {
    auto ckpt = Checkpoint::Open(model);
    status = ckpt.status();
    if (status.ok()) {
      Loader loader;
      ParallelOptions par;
      par.world_size = world;
      par.rank = rank;
      par.tp = world;
      par.bucket_bytes = bucket_bytes;
      auto loaded = LoadRank(loader, *ckpt, par, PlanOptions(), **groups);
      status = loaded.status();
      if (loaded.ok()) {
        uint64_t requested = 0;  // read or copied from the page cache, as the reader counts
        for (const RouteCount& c : loaded->read_stats.routes) requested += c.bytes;
        report["read_bytes"] = requested;
        report["share_read_bytes"] = loaded->share.read_bytes;
        report["received_bytes"] = loaded->received_bytes;
        for (const Tensor& t : loaded->tensors) {
          std::vector<float> values(t.nbytes() / 4);
          if (t.nbytes() > 0) std::memcpy(values.data(), t.data(), t.nbytes());
          report["tensors"][t.name()] = values;
        }
      }
    }
  }
  report["status"] = status.ToString();
  std::ofstream(out) << report.dump();
}

struct Ranks {
  std::vector<nlohmann::json> reports;
  double seconds = 0;
};

// Forks `world` ranks, rank r loading models[r]; `dies`: that rank exits before it connects;
// `other_bucket`: that rank exchanges in buckets of 1 MiB (the others 256 MiB).
Ranks RunGroup(const std::vector<std::string>& models, int salt, int dies = -1,
               int other_bucket = -1) {
  const int world = static_cast<int>(models.size());
  testing::TempDir dir;
  const int port = testing::FreshPort(salt);
  Ranks out;
  out.seconds = testing::ForkRanks(world, [&](int r) {
    const uint64_t bucket = r == other_bucket ? 1ULL << 20 : ParallelOptions().bucket_bytes;
    const std::string file = dir.path() + "/" + std::to_string(r);
    if (r != dies) RunRank(models[r], world, r, port, bucket, file);
  });
  for (int r = 0; r < world; ++r) {
    out.reports.push_back(testing::ReadReport(dir.path() + "/" + std::to_string(r)));
  }
  return out;
}

TEST_CASE("ranks over c10d: 2 and 4 processes hold what transformers gives each rank") {
  for (int world : {2, 4}) {
    const Ranks ranks = RunGroup(std::vector<std::string>(world, kModels + "llama"), world);
    uint64_t received = 0;
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& report = ranks.reports[r];
      INFO("rank " << r << " of " << world << ": " << report.dump().substr(0, 300));
      REQUIRE(report.is_object());
      REQUIRE(report["status"] == "OK");
      CHECK(report["read_bytes"] == report["share_read_bytes"]);
      received += report["received_bytes"].get<uint64_t>();
      for (const auto& param : testing::TpCase("llama")["parameters"]) {
        std::vector<float> expected;
        for (uint64_t i : testing::TpIndices(param, world, r)) {
          expected.push_back(static_cast<float>(i));
        }
        CHECK(report["tensors"][param["name"].get<std::string>()].get<std::vector<float>>() ==
              expected);
      }
    }
    CHECK(received > 0);  // the row-wise parts came over Gloo
  }
}

TEST_CASE("ranks over c10d: a rank that dies, another checkpoint, another split: all end, why") {
  const std::string llama = kModels + "llama";
  Ranks ranks = RunGroup({llama, llama, llama}, 7, /*dies=*/1);
  CHECK(ranks.seconds < 40);
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << ranks.reports[r].dump());
    REQUIRE(ranks.reports[r].is_object());
    CHECK(ranks.reports[r]["status"] != "OK");
  }
  ranks = RunGroup({llama, kModels + "by-hand"}, 11);
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << ranks.reports[r].dump());
    REQUIRE(ranks.reports[r].is_object());
    CHECK_THAT(ranks.reports[r]["status"].get<std::string>(),
               Catch::Contains("differs from rank 0's"));
  }
  // Same checkpoint, but rank 1 would cut the exchange into other buckets: the ranks' all-to-alls
  // would not match, so every rank refuses before the first.
  ranks = RunGroup({llama, llama}, 13, /*dies=*/-1, /*other_bucket=*/1);
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << ranks.reports[r].dump());
    REQUIRE(ranks.reports[r].is_object());
    CHECK_THAT(ranks.reports[r]["status"].get<std::string>(),
               Catch::Contains("rank 1's parallel layout") &&
                   Catch::Contains("differs from rank 0's"));
  }
}

}  // namespace
}  // namespace loadstone
