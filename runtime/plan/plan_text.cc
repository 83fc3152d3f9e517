// How a LoadPlan reads to a person: conversion names and LoadPlan::ToString().
#include <array>
#include <map>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "loadstone/plan.h"

namespace loadstone {

std::string_view ConversionName(Conversion conversion) {
  switch (conversion) {
    case Conversion::kNone: return "none";
    case Conversion::kCast: return "cast";
    case Conversion::kDequantFp8Block: return "fp8-block-dequant";
    case Conversion::kRelayout: return "relayout";
    case Conversion::kDequantBlocks: return "block-dequant";
    case Conversion::kDequantBnb4: return "bnb4-dequant";
    case Conversion::kDequantBnb8: return "bnb8-dequant";
    case Conversion::kDequantPackedInt: return "int-dequant";
  }
  return "?";
}

std::string_view ReadRouteName(ReadRoute route) {
  switch (route) {
    case ReadRoute::kInPlace: return "in place";
    case ReadRoute::kStaged: return "staged";
    case ReadRoute::kStagedWhenCold: return "staged when cold";
    case ReadRoute::kFreshPages: return "fresh pages";
    case ReadRoute::kMapped: return "mapped";
    case ReadRoute::kPageCacheCopy: return "page-cache copy";
  }
  return "?";
}

std::string_view TensorMemoryName(TensorMemory memory) {
  switch (memory) {
    case TensorMemory::kHost: return "host";
    case TensorMemory::kDevice: return "device";
    case TensorMemory::kCaller: return "caller";
    case TensorMemory::kPinned: return "pinned";
    case TensorMemory::kMapped: return "mapped";
    case TensorMemory::kFreshPages: return "fresh pages";
    case TensorMemory::kArena: return "arena";
    case TensorMemory::kShared: return "shared";
  }
  return "?";
}

std::string_view ConversionSiteName(ConversionSite site) {
  switch (site) {
    case ConversionSite::kNone: return "none";
    case ConversionSite::kCpu: return "cpu";
    case ConversionSite::kDevice: return "device";
    case ConversionSite::kCpuThenDevice: return "cpu+device";
  }
  return "?";
}

RouteCounts LoadPlan::RouteTotals() const {
  RouteCounts out{};
  for (const ReadChunk& r : reads) {
    RouteCount& count = out[static_cast<size_t>(r.route)];
    ++count.reads;
    count.bytes += r.length;
  }
  return out;
}

std::string LoadPlan::ToString() const {
  std::map<std::string, std::pair<size_t, uint64_t>> per_target;
  size_t casts = 0, dequants = 0, relayouts = 0, block_dequants = 0, state_dequants = 0;
  for (const TensorPlan& t : tensors) {
    auto& entry =
        per_target[fmt::format("{} {}", targets[t.device].ToString(), SafetensorsName(t.dtype))];
    ++entry.first;
    entry.second += t.nbytes;
    casts += t.conversion == Conversion::kCast;
    dequants += t.conversion == Conversion::kDequantFp8Block;
    relayouts += t.conversion == Conversion::kRelayout;
    block_dequants += t.conversion == Conversion::kDequantBlocks;
    state_dequants += DecodesWithState(t.conversion);
  }
  std::string out = fmt::format("plan: {} tensors, {} bytes read, {} bytes placed, {} casts",
                                tensors.size(), read_bytes, placed_bytes, casts);
  if (dequants > 0) out += fmt::format(", {} float8 block dequants", dequants);
  if (relayouts > 0) out += fmt::format(", {} relayouts (strided or big-endian)", relayouts);
  if (block_dequants > 0) out += fmt::format(", {} quantized-block dequants", block_dequants);
  if (state_dequants > 0) {
    out += fmt::format(", {} dequants with a quant state (bitsandbytes, compressed-tensors)",
                       state_dequants);
  }
  out += "\n";
  out += fmt::format("  device map: {}\n", devices.device_map.ToJson());
  for (const std::string& w : warnings) out += fmt::format("  warning: {}\n", w);
  for (const auto& [target, count_bytes] : per_target) {
    out += fmt::format("  {}: {} tensors, {} bytes\n", target, count_bytes.first, count_bytes.second);
  }
  if (!offloaded.empty()) {
    size_t in_place = 0;
    for (const OffloadPlan& o : offloaded) in_place += o.in_place;
    out += fmt::format("  disk: {} tensors, {} bytes ({} read in place from their safetensors "
                       "file, {} written to {})\n",
                       offloaded.size(), offloaded_bytes, in_place, offloaded.size() - in_place,
                       offload_folder.empty() ? "no folder" : offload_folder);
  }
  // A route that names two ("staged when cold", "fresh pages") is settled as each read's turn
  // comes; the trace and ReadStats::routes say which each took.
  out += fmt::format("  reads: {}\n", reads.size());
  const auto totals = RouteTotals();
  for (size_t r = 0; r < totals.size(); ++r) {
    if (totals[r].reads == 0) continue;
    out += fmt::format("    {}: {} reads, {} bytes\n", ReadRouteName(static_cast<ReadRoute>(r)),
                       totals[r].reads, totals[r].bytes);
  }
  return out;
}

}  // namespace loadstone
