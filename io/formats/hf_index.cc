#include "io/formats/hf_index.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "io/formats/json_util.h"
#include "io/formats/limits.h"

namespace loadstone::io {
namespace {

bool EscapesFolder(std::string_view name) {
  if (name.empty() || name.front() == '/') return true;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) slash = name.size();
    if (name.substr(start, slash - start) == "..") return true;
    start = slash + 1;
  }
  return false;
}

Result<ShardIndex> ToShardIndex(const nlohmann::json& doc, const std::string& path,
                                const std::string& what) {
  if (!doc.is_object()) return Status::Corruption(what + " is not a JSON object");
  const auto* map = &doc;
  if (auto it = doc.find("weight_map"); it != doc.end()) {
    if (!it->is_object()) return Status::Corruption(what + ": \"weight_map\" is not an object");
    map = &*it;
  } else if (doc.contains("metadata")) {
    return Status::Corruption(what + " has \"metadata\" but no \"weight_map\"");
  }
  ShardIndex index;
  index.path = path;
  index.weight_map.reserve(map->size());
  // Each shard name once, not once per tensor (a 100,000-tensor index names four files):
  // numbered in order of first mention, then renumbered in sorted order.
  std::unordered_map<std::string_view, uint32_t> first_seen;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      return Status::Corruption(fmt::format("{}: tensor '{}' maps to {}, not to a file name",
                                            what, tensor, DescribeJsonValue(file)));
    }
    const auto& name = file.get_ref<const std::string&>();
    auto [it, inserted] = first_seen.emplace(name, static_cast<uint32_t>(first_seen.size()));
    if (inserted && EscapesFolder(name)) {
      return Status::Corruption(fmt::format(
          "{}: tensor '{}' maps to '{}', which is not a file inside the index's folder", what,
          tensor, name));
    }
    index.weight_map.emplace_back(tensor, it->second);
  }
  for (const auto& [name, id] : first_seen) index.shards.emplace_back(name);
  std::sort(index.shards.begin(), index.shards.end());
  std::vector<uint32_t> sorted_id(first_seen.size());  // order of first mention → sorted
  for (const auto& [name, id] : first_seen) {
    sorted_id[id] = static_cast<uint32_t>(
        std::lower_bound(index.shards.begin(), index.shards.end(), name) - index.shards.begin());
  }
  for (auto& entry : index.weight_map) entry.second = sorted_id[entry.second];
  return index;
}

}  // namespace

Result<ShardIndex> ReadShardIndex(const std::string& path) {
  const std::string what = fmt::format("index '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(
      auto doc, ReadJsonFile(path, what, kMaxShardIndexBytes, "kMaxShardIndexBytes"));
  return InterpretJson(what, [&] { return ToShardIndex(doc, path, what); });
}

}  // namespace loadstone::io
