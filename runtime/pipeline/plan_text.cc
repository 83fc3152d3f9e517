// How a LoadPlan reads to a person: conversion names and LoadPlan::ToString().
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
  }
  return "?";
}

std::string LoadPlan::ToString() const {
  std::map<std::string, std::pair<size_t, uint64_t>> per_target;
  size_t casts = 0, dequants = 0, staged_reads = 0;
  for (const TensorPlan& t : tensors) {
    auto& entry = per_target[fmt::format("{} {}", t.device, SafetensorsName(t.dtype))];
    ++entry.first;
    entry.second += t.nbytes;
    casts += t.conversion == Conversion::kCast;
    dequants += t.conversion == Conversion::kDequantFp8Block;
  }
  for (const ReadChunk& r : reads) staged_reads += r.staged;
  std::string out = fmt::format("plan: {} tensors, {} bytes read, {} bytes placed, {} casts",
                                tensors.size(), read_bytes, placed_bytes, casts);
  if (dequants > 0) out += fmt::format(", {} float8 block dequants", dequants);
  out += "\n";
  out += fmt::format("  device map: {}\n", devices.device_map.ToJson());
  for (const std::string& w : warnings) out += fmt::format("  warning: {}\n", w);
  for (const auto& [target, count_bytes] : per_target) {
    out += fmt::format("  {}: {} tensors, {} bytes\n", target, count_bytes.first, count_bytes.second);
  }
  // How an unconverted read lands (in place, through staging, copied from the page cache) is
  // the Loader's choice at run time; the load's backend line says which.
  out += fmt::format("  reads: {} ({} staged to convert or coalesce, {} unconverted)\n",
                     reads.size(), staged_reads, reads.size() - staged_reads);
  return out;
}

}  // namespace loadstone
