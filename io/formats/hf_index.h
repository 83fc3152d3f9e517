// Hugging Face shard index: `{"metadata": {...}, "weight_map": {tensor: shard file}}`, or a
// flat `{tensor: shard file}` map.
#ifndef LOADSTONE_IO_FORMATS_HF_INDEX_H_
#define LOADSTONE_IO_FORMATS_HF_INDEX_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/name_index.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct ShardIndex {
  std::string path;
  // tensor name → its shard (an index into `shards`).
  std::vector<std::pair<std::string, uint32_t>> weight_map;
  // Distinct shard names, sorted (model-00001-of-00003 first).
  std::vector<std::string> shards;
  // weight_map's names, indexed.
  NameIndex names;

  // The shard of `tensor`, if the index maps it.
  std::optional<uint32_t> ShardOf(std::string_view tensor) const {
    const auto at = names.Find(tensor, [this](size_t i) -> std::string_view {
      return weight_map[i].first;
    });
    if (!at) return std::nullopt;
    return weight_map[*at].second;
  }
};

// Errors: Corruption for invalid JSON, a duplicate key, a non-string shard name, or a shard
// name that leaves the folder (absolute, or with a ".." component).
// `on_shard`, when given, hears each shard name as the reading first meets it, already checked to
// be a file inside the folder (the index may yet fail, or name more): a caller may start on the
// shards before the index is read.
Result<ShardIndex> ReadShardIndex(const std::string& path,
                                  const std::function<void(const std::string&)>& on_shard = {});

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_HF_INDEX_H_
