#include "io/formats/hf_index.h"

#include <algorithm>

#include <fmt/format.h>

#include "io/formats/json_util.h"

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
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      return Status::Corruption(fmt::format("{}: tensor '{}' maps to {}, not to a file name",
                                            what, tensor, DescribeJsonValue(file)));
    }
    const auto& name = file.get_ref<const std::string&>();
    if (EscapesFolder(name)) {
      return Status::Corruption(fmt::format(
          "{}: tensor '{}' maps to '{}', which is not a file inside the index's folder", what,
          tensor, name));
    }
    index.weight_map.emplace_back(tensor, name);
    index.shards.push_back(name);
  }
  std::sort(index.shards.begin(), index.shards.end());
  index.shards.erase(std::unique(index.shards.begin(), index.shards.end()), index.shards.end());
  return index;
}

}  // namespace

Result<ShardIndex> ReadShardIndex(const std::string& path) {
  const std::string what = fmt::format("index '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(auto doc, ReadJsonFile(path, what, 256ULL << 20));
  return InterpretJson(what, [&] { return ToShardIndex(doc, path, what); });
}

}  // namespace loadstone::io
