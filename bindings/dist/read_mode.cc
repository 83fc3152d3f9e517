// ReadMode::kAuto (read_mode.h).
#include "bindings/dist/read_mode.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace loadstone::dist {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::max(std::chrono::duration<double>(Clock::now() - since).count(), 1e-9);
}

// Bytes a second one rank receives while all ranks of the group send kLinkProbeBytes to each
// other rank at once (the second of two rounds: the first opens the pairs' connections).
Result<double> MeasureLink(Exchange& exchange) {
  const int n = exchange.size();
  std::vector<uint64_t> counts(n, kLinkProbeBytes);
  counts[exchange.rank()] = 0;
  const uint64_t total = kLinkProbeBytes * static_cast<uint64_t>(n - 1);
  std::unique_ptr<std::byte[]> send(new std::byte[total]());
  std::unique_ptr<std::byte[]> recv(new std::byte[total]);
  double seconds = 0;
  for (int round = 0; round < 2; ++round) {
    const auto start = Clock::now();
    LOADSTONE_RETURN_IF_ERROR(
        exchange.AllToAll({send.get(), total}, counts, {recv.get(), total}, counts));
    seconds = Seconds(start);
  }
  return static_cast<double>(total) / seconds;
}

// Bytes a second of a load of the first kReadProbeBytes (or so: whole tensors) of `each`'s reads.
Result<double> MeasureRead(Loader& loader, const RankShare& each, const PlanOptions& options,
                           uint64_t* probed) {
  std::vector<TensorInfo> sample;
  uint64_t bytes = 0;
  for (const TensorInfo& t : each.reads.tensors()) {
    if (bytes >= kReadProbeBytes) break;
    // Plain tensors only: a quantized weight would need its quant state beside it.
    if (t.nbytes == 0 || t.packed || each.reads.Dequantizes(t)) continue;
    sample.push_back(t);
    bytes += t.nbytes;
  }
  *probed = bytes;
  if (bytes == 0) return 0.0;
  LOADSTONE_ASSIGN_OR_RETURN(Checkpoint view, each.reads.WithTensors(std::move(sample)));
  PlanOptions probe = RankPlanOptions(options);
  probe.dtype.reset();  // the bytes as stored: what is measured is the storage
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(view, probe));
  const auto start = Clock::now();
  LoadHandle handle = loader.Load(view, plan);
  LOADSTONE_RETURN_IF_ERROR(handle.Done().get());
  return static_cast<double>(bytes) / Seconds(start);
}

}  // namespace

Result<ReadModeChoice> ChooseReadMode(Loader& loader, const RankShare& each,
                                      const PlanOptions& options, ProcessGroups& groups) {
  ReadModeChoice choice;
  const int tp = each.options.tp;
  if (tp == 1) return choice;
  // A rank that fails to measure still takes part in both all-gathers (with 0), so that every
  // rank ends with the same error instead of waiting for it.
  Result<double> link = MeasureLink(groups.exchange());
  Result<double> read = 1.0;  // only the group's first rank reads
  if (each.tp_rank == 0) read = MeasureRead(loader, each, options, &choice.probe_bytes);
  // 0: this rank failed to measure; else at least 1.
  const auto as_value = [](const Result<double>& r) -> uint64_t {
    return r.ok() ? std::max<uint64_t>(static_cast<uint64_t>(*r), 1) : 0;
  };
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<uint64_t> reads, groups.AllGather(as_value(read)));
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<uint64_t> links, groups.AllGather(as_value(link)));
  if (!link.ok()) return link.status().WithContext("measuring the group's link");
  if (!read.ok()) return read.status().WithContext("measuring the storage's read bandwidth");
  // Any rank of the world that failed ends every rank (the others would wait for it later).
  for (size_t r = 0; r < reads.size() && r < links.size(); ++r) {
    if (reads[r] == 0 || links[r] == 0) {
      return Status::IOError(fmt::format(
          "rank {} failed to measure its {} (--read-mode auto; its own error says why)", r,
          reads[r] == 0 ? "storage" : "link"));
    }
  }
  const size_t first = static_cast<size_t>(each.group) * static_cast<size_t>(tp);
  uint64_t slowest = UINT64_MAX;
  for (size_t r = first; r < first + static_cast<size_t>(tp); ++r) {
    slowest = std::min(slowest, links[r]);
  }
  choice.read_bytes_per_s = static_cast<double>(reads[first]);
  choice.link_bytes_per_s = static_cast<double>(slowest);
  choice.cost = EstimateReadModes(each, choice.read_bytes_per_s, choice.link_bytes_per_s);
  choice.mode = choice.cost.once_seconds < choice.cost.each_seconds ? ReadMode::kOnce
                                                                    : ReadMode::kEachRank;
  return choice;
}

}  // namespace loadstone::dist
