#include "io/formats/hf_index.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "io/formats/json_scan.h"
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

// The shard names of an index, each once however many tensors name it (a 100,000-tensor index
// names four files): numbered in order of first mention, then renumbered in sorted order.
class ShardNumbers {
 public:
  // The number of shard `name`; `fresh` says whether this is its first mention.
  uint32_t Of(std::string_view name, bool* fresh) {
    *fresh = false;
    if (last_ != nullptr && last_->first == name) return last_->second;  // runs of one shard
    auto it = ids_.find(name);
    if (it == ids_.end()) {
      it = ids_.emplace(std::string(name), static_cast<uint32_t>(ids_.size())).first;
      *fresh = true;
    }
    last_ = &*it;
    return it->second;
  }

  // Sorts the names into index->shards, renumbers index->weight_map, and makes the lookup;
  // false when a tensor is mapped twice.
  bool Finish(ShardIndex* index) {
    for (const auto& [name, id] : ids_) index->shards.push_back(name);
    std::sort(index->shards.begin(), index->shards.end());
    std::vector<uint32_t> sorted_id(ids_.size());  // order of first mention → sorted
    for (const auto& [name, id] : ids_) {
      sorted_id[id] = static_cast<uint32_t>(
          std::lower_bound(index->shards.begin(), index->shards.end(), name) -
          index->shards.begin());
    }
    for (auto& entry : index->weight_map) entry.second = sorted_id[entry.second];
    const auto& map = index->weight_map;
    return index->names.Build(map.size(), [&map](size_t i) -> std::string_view {
             return map[i].first;
           }) == NameIndex::kNone;
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> ids_;
  const std::pair<const std::string, uint32_t>* last_ = nullptr;
};

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
  ShardNumbers numbers;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      return Status::Corruption(fmt::format("{}: tensor '{}' maps to {}, not to a file name",
                                            what, tensor, DescribeJsonValue(file)));
    }
    const auto& name = file.get_ref<const std::string&>();
    bool fresh;
    const uint32_t id = numbers.Of(name, &fresh);
    if (fresh && EscapesFolder(name)) {
      return Status::Corruption(fmt::format(
          "{}: tensor '{}' maps to '{}', which is not a file inside the index's folder", what,
          tensor, name));
    }
    index.weight_map.emplace_back(tensor, id);
  }
  if (!numbers.Finish(&index)) {  // not reachable: a parsed object holds each key once
    return Status::Corruption(what + " maps a tensor twice");
  }
  return index;
}

// The index as every producer writes it, read in one pass: an object with a "weight_map" object
// of strings, naming only files inside the folder, no key twice in any object, nothing nested
// deeper than kMaxJsonDepth. It declines (returns false from a handler) anything else; the
// document is then read by ParseJsonStrict and ToShardIndex, which name what is wrong.
class CommonIndexSax {
 public:
  using json = nlohmann::json;
  explicit CommonIndexSax(const std::function<void(const std::string&)>& on_shard)
      : on_shard_(on_shard) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const std::string&) { return Value(); }
  bool binary(json::binary_t&) { return false; }
  bool string(std::string& s) {
    if (depth_ != kMapDepth || !in_map_) return Value();
    bool fresh;
    const uint32_t id = numbers_.Of(s, &fresh);
    if (fresh) {
      if (EscapesFolder(s)) return false;
      if (on_shard_) on_shard_(s);
    }
    index.weight_map.emplace_back(key_, id);
    return true;
  }
  bool start_object(std::size_t) {
    if (in_map_ || ++depth_ > kMaxJsonDepth) return false;
    if (depth_ == kMapDepth && top_key_ == "weight_map") {
      in_map_ = true;
      return true;
    }
    keys_.emplace_back();
    return true;
  }
  bool key(std::string& k) {
    if (in_map_) {
      key_ = k;
      return true;
    }
    if (!keys_.back().insert(k).second) return false;
    if (depth_ == 1) top_key_ = k;
    return true;
  }
  bool end_object() {
    if (in_map_) {
      in_map_ = false;
      seen_map_ = true;
    } else {
      keys_.pop_back();
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (in_map_ || depth_ == 0) return false;
    if (depth_ == 1 && top_key_ == "weight_map") return false;
    return ++depth_ <= kMaxJsonDepth;
  }
  bool end_array() {
    --depth_;
    return true;
  }

  // After a parse that no handler refused: the index, or nothing (no weight_map, or a tensor
  // mapped twice).
  std::optional<ShardIndex> Finish(const std::string& path) {
    if (!seen_map_ || !numbers_.Finish(&index)) return std::nullopt;
    index.path = path;
    return std::move(index);
  }

  ShardIndex index;

 private:
  static constexpr int kMapDepth = 2;

  // A scalar: never the top-level value, never in the weight_map (only strings are), and never
  // the weight_map itself.
  bool Value() const { return depth_ > 0 && !in_map_ && !(depth_ == 1 && top_key_ == "weight_map"); }

  const std::function<void(const std::string&)>& on_shard_;
  int depth_ = 0;
  bool in_map_ = false;
  bool seen_map_ = false;
  std::string top_key_;
  std::string key_;
  std::vector<std::set<std::string>> keys_;  // one per open object but the weight_map
  ShardNumbers numbers_;
};

}  // namespace

Result<ShardIndex> ReadShardIndex(const std::string& path,
                                  const std::function<void(const std::string&)>& on_shard) {
  const std::string what = fmt::format("index '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(
      std::string text, ReadSmallFile(path, what, kMaxShardIndexBytes, "kMaxShardIndexBytes"));
  CommonIndexSax common(on_shard);
  if (ScanJson(text, &common) == ScanResult::kParsed) {
    if (std::optional<ShardIndex> index = common.Finish(path)) return std::move(*index);
  }
  LOADSTONE_ASSIGN_OR_RETURN(auto doc, ParseJsonStrict(text, what));
  return InterpretJson(what, [&] { return ToShardIndex(doc, path, what); });
}

}  // namespace loadstone::io
