#include "runtime/device_map/clean.h"

#include <string_view>
#include <unordered_map>

namespace loadstone::device_map {
namespace {

struct TrieNode {
  std::string name;              // the dotted prefix
  std::vector<int32_t> children;  // in order of first appearance
  std::unordered_map<std::string_view, int32_t> by_component;
  int32_t key = -1;  // the entry stored under exactly this prefix
  size_t below = 0;  // entries strictly below
  bool uniform = true;
  bool has_device = false;
  Device device;
};

class Cleaner {
 public:
  explicit Cleaner(const std::vector<DeviceMap::Entry>& entries)
      : entries_(entries), deleted_(entries.size(), false) {
    nodes_.emplace_back();
    for (size_t i = 0; i < entries.size(); ++i) Insert(static_cast<int32_t>(i));
    Aggregate(0);
  }

  std::vector<DeviceMap::Entry> Run() {
    Process(0, true);
    std::vector<DeviceMap::Entry> out;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!deleted_[i]) out.push_back(Current(static_cast<int32_t>(i)));
    }
    for (const DeviceMap::Entry& e : appended_) out.push_back(e);
    return out;
  }

 private:
  DeviceMap::Entry Current(int32_t i) const {
    DeviceMap::Entry e = entries_[static_cast<size_t>(i)];
    if (auto it = updated_.find(i); it != updated_.end()) e.device = it->second;
    return e;
  }

  void Insert(int32_t i) {
    std::string_view name = entries_[static_cast<size_t>(i)].prefix;
    int32_t node = 0;
    size_t start = 0;
    while (!name.empty()) {
      size_t dot = name.find('.', start);
      std::string_view component =
          name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
      auto it = nodes_[static_cast<size_t>(node)].by_component.find(component);
      if (it == nodes_[static_cast<size_t>(node)].by_component.end()) {
        auto id = static_cast<int32_t>(nodes_.size());
        TrieNode child;
        child.name = std::string(name.substr(0, dot == std::string_view::npos ? name.size() : dot));
        nodes_.push_back(std::move(child));
        nodes_[static_cast<size_t>(node)].by_component.emplace(component, id);
        nodes_[static_cast<size_t>(node)].children.push_back(id);
        node = id;
      } else {
        node = it->second;
      }
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
    nodes_[static_cast<size_t>(node)].key = i;
  }

  void Merge(TrieNode& into, bool uniform, bool has_device, Device device) {
    if (!uniform) into.uniform = false;
    if (!has_device) return;
    if (into.has_device && into.device != device) into.uniform = false;
    into.has_device = true;
    into.device = device;
  }

  void Aggregate(int32_t id) {
    for (int32_t c : nodes_[static_cast<size_t>(id)].children) {
      Aggregate(c);
      TrieNode& child = nodes_[static_cast<size_t>(c)];
      TrieNode& node = nodes_[static_cast<size_t>(id)];
      node.below += child.below;
      Merge(node, child.uniform, child.has_device, child.device);
      if (child.key >= 0) {
        ++node.below;
        Merge(node, true, true, entries_[static_cast<size_t>(child.key)].device);
      }
    }
  }

  void DeleteBelow(int32_t id) {
    for (int32_t c : nodes_[static_cast<size_t>(id)].children) {
      if (nodes_[static_cast<size_t>(c)].key >= 0) deleted_[static_cast<size_t>(nodes_[static_cast<size_t>(c)].key)] = true;
      DeleteBelow(c);
    }
  }

  void Process(int32_t id, bool is_root) {
    TrieNode& node = nodes_[static_cast<size_t>(id)];
    size_t count = node.below;
    bool uniform = node.uniform;
    bool has_device = node.has_device;
    Device device = node.device;
    if (is_root && node.key >= 0) {
      ++count;
      Device own = entries_[static_cast<size_t>(node.key)].device;
      if (has_device && own != device) uniform = false;
      device = own;
    }
    if (uniform && count > 1) {
      DeleteBelow(id);
      if (is_root && node.key >= 0) deleted_[static_cast<size_t>(node.key)] = true;
      if (!is_root && node.key >= 0) {
        updated_[node.key] = device;
      } else {
        appended_.push_back(DeviceMap::Entry{node.name, device});
      }
      return;
    }
    std::vector<int32_t> children = node.children;
    for (int32_t c : children) Process(c, false);
  }

  const std::vector<DeviceMap::Entry>& entries_;
  std::vector<TrieNode> nodes_;
  std::vector<bool> deleted_;
  std::unordered_map<int32_t, Device> updated_;
  std::vector<DeviceMap::Entry> appended_;
};

}  // namespace

std::vector<DeviceMap::Entry> CleanDeviceMap(const std::vector<DeviceMap::Entry>& entries) {
  return Cleaner(entries).Run();
}

}  // namespace loadstone::device_map
