// Weight updates in place against the link's own broadcasts (issue 33's Must-show;
// docs/distributed.md): two processes on 127.0.0.1 — a trainer (rank 0) holding the model's
// tensors and an engine (rank 1) holding its own copy as LiveWeights — in one loop of rounds,
// each round in a shuffled order:
//   - link: the trainer broadcasts as many bytes as the model has, in buckets of --bucket-mib,
//     from one buffer to one buffer (c10d Gloo broadcasts, nothing else);
//   - update: SendWeights / ReceiveWeights of the whole model as the next version (manifest,
//     agreement, the same buckets, packing and staging, the write under the lock).
// Times are the engine's, from its first call to its last (an update's also split into its
// transfer — manifest agreed to every bucket staged — and its write under the lock). The first
// update also allocates the engine's staging (kept for the next ones). Prints one JSON document.
//
//   update_bench MODEL [--rounds 3] [--bucket-mib 256] [--port 29650] [--out FILE]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/torch.h"
#include "loadstone/weight_update.h"

namespace {

using Clock = std::chrono::steady_clock;
using loadstone::Status;

struct Args {
  std::string model;
  int rounds = 3;
  uint64_t bucket_mib = 256;
  int port = 29650;
  std::string out;
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The link alone: `total` bytes from rank 0 to rank 1 in broadcasts of `bucket` bytes.
Status Link(loadstone::ProcessGroups& groups, std::vector<std::byte>& buffer, uint64_t total) {
  for (uint64_t sent = 0; sent < total; sent += buffer.size()) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), total - sent);
    LOADSTONE_RETURN_IF_ERROR(groups.Broadcast({buffer.data(), n}, 0));
  }
  return Status::OK();
}

// One rank's side of every round; the engine's document in `doc`.
Status Run(const Args& a, int rank, nlohmann::json& doc) {
  auto state = loadstone::libtorch::LoadStateDict(a.model);
  LOADSTONE_RETURN_IF_ERROR(state.status());
  uint64_t total = 0;
  for (const auto& [name, t] : state->tensors) total += t.nbytes();
  loadstone::GroupOptions g;
  g.world_size = 2;
  g.rank = rank;
  g.master_port = a.port;
  g.timeout = std::chrono::seconds(300);
  auto groups = loadstone::ProcessGroups::Connect(g, 1);
  LOADSTONE_RETURN_IF_ERROR(groups.status());
  auto live = loadstone::LiveWeights::Of(state->tensors);
  LOADSTONE_RETURN_IF_ERROR(live.status());
  loadstone::WeightUpdateOptions options;
  options.bucket_bytes = a.bucket_mib << 20;
  std::vector<std::byte> buffer(options.bucket_bytes);
  std::mt19937 shuffle(12345);  // the same order on both ranks
  doc = {{"model", a.model}, {"bytes", total}, {"bucket_bytes", options.bucket_bytes},
         {"link_seconds", nlohmann::json::array()}, {"update_seconds", nlohmann::json::array()},
         {"apply_seconds", nlohmann::json::array()},
         {"transfer_seconds", nlohmann::json::array()}};
  for (int round = 0; round < a.rounds; ++round) {
    std::vector<std::string> order = {"link", "update"};
    std::shuffle(order.begin(), order.end(), shuffle);
    for (const std::string& what : order) {
      const auto start = Clock::now();
      if (what == "link") {
        LOADSTONE_RETURN_IF_ERROR(Link(**groups, buffer, total));
        doc["link_seconds"].push_back(Seconds(start));
      } else if (rank == 0) {
        LOADSTONE_RETURN_IF_ERROR(
            loadstone::SendWeights(**groups, state->tensors, round + 1, options).status());
      } else {
        auto got = loadstone::ReceiveWeights(**groups, **live, options);
        LOADSTONE_RETURN_IF_ERROR(got.status());
        doc["update_seconds"].push_back(Seconds(start));
        doc["apply_seconds"].push_back(got->apply_seconds);
        doc["transfer_seconds"].push_back(got->transfer_seconds);
      }
    }
  }
  return Status::OK();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("Weight updates in place against the link's own broadcasts");
  app.add_option("model", a.model, "A model folder or file")->required();
  app.add_option("--rounds", a.rounds)->check(CLI::Range(1, 100));
  app.add_option("--bucket-mib", a.bucket_mib)->check(CLI::Range(1, 4096));
  app.add_option("--port", a.port)->check(CLI::Range(1024, 65535));
  app.add_option("--out", a.out);
  CLI11_PARSE(app, argc, argv);
  const pid_t trainer = fork();
  if (trainer == 0) {
    nlohmann::json unused;
    const Status s = Run(a, 0, unused);
    if (!s.ok()) std::fprintf(stderr, "trainer: %s\n", s.ToString().c_str());
    _exit(s.ok() ? 0 : 1);
  }
  nlohmann::json doc;
  const Status s = Run(a, 1, doc);
  int status = 0;
  waitpid(trainer, &status, 0);
  if (!s.ok() || status != 0) {
    std::fprintf(stderr, "engine: %s\n", s.ToString().c_str());
    return 1;
  }
  const double link = Median(doc["link_seconds"].get<std::vector<double>>());
  const double update = Median(doc["update_seconds"].get<std::vector<double>>());
  const double bytes = doc["bytes"].get<double>();
  doc["link_bytes_per_s"] = bytes / link;
  doc["update_bytes_per_s"] = bytes / update;
  doc["update_over_link"] = link / update;
  doc["transfer_over_link"] = link / Median(doc["transfer_seconds"].get<std::vector<double>>());
  const std::string text = doc.dump(2);
  std::printf("%s\n", text.c_str());
  if (!a.out.empty()) {
    std::ofstream(a.out + ".tmp") << text << "\n";
    std::rename((a.out + ".tmp").c_str(), a.out.c_str());
  }
  return 0;
}
