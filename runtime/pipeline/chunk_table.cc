#include "runtime/pipeline/chunk_table.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace loadstone::pipeline {

void ChunkTable::SettleAtStart(const StartFacts& facts, bool guarded) {
  chunks_.resize(plan_.reads.size());
  for (size_t i = 0; i < plan_.reads.size(); ++i) {
    const ReadChunk& read = plan_.reads[i];
    chunks_[i].route = RouteAtStart(read.route, plan_.routes, facts);
    chunks_[i].copy_when_cached = guarded && !read.shared_buffer && read.tensors.size() == 1 &&
                                  plan_.tensors[read.tensors[0]].memory_given();
  }
}

ReadRoute ChunkTable::RouteNow(uint64_t id, const io::Reader& reader,
                               const std::byte** cached) const {
  const ReadChunk& chunk = plan_.reads[id];
  TurnFacts facts;
  const ReadRoute settled = chunks_[id].route;
  if (settled == ReadRoute::kStagedWhenCold) {
    facts.cold = reader.ReadsDirect(chunk.file, chunk.offset, chunk.length);
  }
  if (settled == ReadRoute::kFreshPages ||
      (chunks_[id].copy_when_cached && !facts.cold &&
       (settled == ReadRoute::kInPlace || settled == ReadRoute::kStagedWhenCold))) {
    *cached = reader.CachedView(chunk.file, chunk.offset, chunk.length);
    facts.cached = *cached != nullptr;
  }
  return RouteAtTurn(settled, facts);
}

uint64_t ChunkTable::LargestStaged() const {
  uint64_t largest = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const ReadRoute route = chunks_[i].route;
    if (route != ReadRoute::kInPlace && route != ReadRoute::kMapped) {
      largest = std::max(largest, plan_.reads[i].length);
    }
  }
  return largest;
}

void ChunkTable::Count(uint64_t id) {
  RouteCount& count = counts_[static_cast<size_t>(chunks_[id].route)];
  ++count.reads;
  count.bytes += plan_.reads[id].length;
}

Status ChunkTable::Error(uint64_t id, const Status& status) const {
  const ReadChunk& chunk = plan_.reads[id];
  std::string names;
  for (size_t k = 0; k < chunk.tensors.size() && k < 3; ++k) {
    names += (k ? ", '" : "'") + NameOf(chunk.tensors[k]) + "'";
  }
  if (chunk.tensors.size() > 3) names += fmt::format(" and {} more", chunk.tensors.size() - 3);
  return status.WithContext(fmt::format("loading tensor {} (bytes {}..{} of '{}')", names,
                                        chunk.offset, chunk.offset + chunk.length,
                                        checkpoint_.files()[chunk.file].path));
}

std::string ChunkTable::Label(uint64_t id) const {
  const ReadChunk& chunk = plan_.reads[id];
  const std::string& first = NameOf(chunk.tensors.front());
  return chunk.tensors.size() == 1 ? first
                                   : fmt::format("{} and {} more", first, chunk.tensors.size() - 1);
}

std::string ChunkTable::Args(uint64_t id) const {
  const ReadChunk& chunk = plan_.reads[id];
  nlohmann::json args = {{"file", checkpoint_.files()[chunk.file].path},
                         {"offset", chunk.offset},
                         {"bytes", chunk.length},
                         {"planned", ReadRouteName(chunk.route)},
                         {"route", ReadRouteName(chunks_[id].route)}};
  auto& names = args["tensors"] = nlohmann::json::array();
  for (size_t k = 0; k < chunk.tensors.size() && k < 8; ++k) {
    names.push_back(NameOf(chunk.tensors[k]));
  }
  if (chunk.tensors.size() > 8) args["more_tensors"] = chunk.tensors.size() - 8;
  return args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace loadstone::pipeline
