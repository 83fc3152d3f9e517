// infer_auto_device_map's main loop.
#include "runtime/device_map/greedy.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

namespace loadstone::device_map {
namespace {

std::string GroupsRepr(const std::vector<std::vector<std::string>>& groups) {
  std::string out = "[";
  for (size_t i = 0; i < groups.size(); ++i) out += (i ? ", " : "") + PyListRepr(groups[i]);
  return out + "]";
}

class Greedy {
 public:
  Greedy(const PlanContext& ctx, const Budgets& budgets)
      : ctx_(ctx), tree_(*ctx.tree), budgets_(budgets), devices_(PlacementDevices(budgets)),
        layers_(*ctx.tree, *ctx.sizes, *ctx.no_split) {
    used_.assign(devices_.size(), PyNum());
    std::vector<Device> gpus;
    for (const Device& d : devices_) {
      if (d.type != Device::Type::kCpu && d.type != Device::Type::kDisk) gpus.push_back(d);
    }
    bool has_mps = false;
    for (const Device& d : gpus) has_mps = has_mps || d.type == Device::Type::kMps;
    if (has_mps) {
      main_devices_ = {Device::Mps()};
    } else if (!gpus.empty()) {
      main_devices_ = {gpus.front(), Device::Cpu()};
    } else {
      main_devices_ = {Device::Cpu()};
    }
  }

  Placement Run();

 private:
  void Explain(std::string line) {
    if (ctx_.explain) out_.explanation.push_back(std::move(line));
  }
  bool IsMain(Device d) const {
    for (const Device& m : main_devices_) {
      if (m == d) return true;
    }
    return false;
  }
  void AddTo(std::vector<std::pair<Device, PyNum>>* list, Device d, PyNum value) {
    for (auto& [device, total] : *list) {
      if (device == d) {
        total += value;
        return;
      }
    }
    list->push_back({d, PyNum() + value});
  }
  void PushFront(const std::vector<Entry>& entries) {
    todo_.insert(todo_.begin(), entries.begin(), entries.end());
  }
  // One step for `entry`; false when the loop must stop (devices exhausted).
  bool Step(Entry entry);
  void RemoveFromTodo(const std::vector<std::string>& names);

  const PlanContext& ctx_;
  const ModuleTree::Impl& tree_;
  const Budgets& budgets_;
  std::vector<Device> devices_;
  std::vector<Device> main_devices_;
  std::vector<PyNum> used_;
  size_t dev_i_ = 0;
  Todo todo_;
  LayerTracker layers_;
  Placement out_;
};

// Each name leaves the list (its first entry by that name): a search each for a few names, one
// pass over the list for many.
void Greedy::RemoveFromTodo(const std::vector<std::string>& names) {
  if (names.size() <= 16) {
    for (const std::string& name : names) {
      auto it = std::find_if(todo_.begin(), todo_.end(), [&](const Entry& e) { return e.name == name; });
      if (it != todo_.end()) todo_.erase(it);
    }
    return;
  }
  std::unordered_set<std::string_view> leaving(names.begin(), names.end());
  Todo kept;
  for (Entry& e : todo_) {
    if (leaving.erase(e.name) == 0) kept.push_back(std::move(e));
  }
  todo_ = std::move(kept);
}

Placement Greedy::Run() {
  todo_ = InitialTodo(tree_);
  layers_.Recompute(todo_, /*with_tensors=*/true);
  while (!todo_.empty()) {
    Entry entry = std::move(todo_.front());
    todo_.pop_front();
    if (!Step(std::move(entry))) break;
  }
  for (size_t i = 0; i < devices_.size(); ++i) out_.used.push_back({devices_[i], used_[i]});
  return std::move(out_);
}

// The body of the `while modules_to_treat:` loop of accelerate's infer_auto_device_map
// (src/accelerate/utils/modeling.py), branch for branch and in its order, so that it can be read
// beside the original.
// Longer than 60 lines: one branch per branch of accelerate's loop, in its order, on purpose.
bool Greedy::Step(Entry entry) {
  const std::string& name = entry.name;
  Explain(fmt::format("Treating module {}.", name));
  layers_.Pop(entry, todo_);
  PyNum size = layers_.EntrySize(entry);
  std::vector<std::vector<std::string>> groups;
  std::vector<std::string> tied = TiedParamsOutside(ctx_, name, &groups);
  if (!groups.empty()) Explain("  Found the relevant tied param groups " + GroupsRepr(groups));
  if (!tied.empty()) Explain("  So those parameters need to be taken into account " + PyListRepr(tied));

  const Device device = devices_[dev_i_];
  PyNum& used = used_[dev_i_];
  const bool unlimited = device.type == Device::Type::kDisk;
  PyNum cap = unlimited ? PyNum() : FindBudget(budgets_, device)->bytes;
  PyNum reserved;
  if (IsMain(device)) {
    cap -= layers_.max_size();
    reserved = layers_.max_size();
  }
  std::vector<ptrdiff_t> tied_index;
  PyNum with_ties = SizeWithTies(ctx_, tied, size, todo_, &tied_index);
  std::vector<std::string> tied_names;
  std::vector<Entry> tied_entries;
  for (ptrdiff_t i : tied_index) {
    if (i < 0) continue;
    tied_names.push_back(todo_[static_cast<size_t>(i)].name);
    tied_entries.push_back(todo_[static_cast<size_t>(i)]);
  }

  if (unlimited || used + with_ties <= cap) {
    std::string line = "Putting " + name;
    line += tied_names.empty() ? fmt::format(" (size={})", size.Repr()) : " and " + PyListRepr(tied_names);
    if (!unlimited) line += fmt::format(" (available={})", (cap - used).Repr());
    Explain(line + fmt::format(" on {}.", device.ToKey()));
    used += with_ties;
    out_.map.Set(name, device);
    if (!tied_names.empty()) RemoveFromTodo(tied_names);
    for (const std::string& tied_name : tied_names) out_.map.Set(tied_name, device);
    if (!ctx_.offload_buffers && entry.is_module()) {
      AddTo(&out_.buffer_bytes, device, ModuleBufferSize(tree_, entry.node, *ctx_.policy));
    }
    return true;
  }

  if (!tied.empty() && used + size <= cap) {
    Explain(fmt::format(
        "Not enough space on {} to put {} and {} (space available {}, needed size {}).",
        device.ToKey(), name, PyListRepr(tied_names), (cap - used).Repr(), with_ties.Repr()));
    for (size_t k = 0; k < tied_entries.size(); ++k) {
      const Entry& tied_entry = tied_entries[k];
      if (!tied_entry.is_module()) continue;
      const TreeNode& node = tree_.nodes[static_cast<size_t>(tied_entry.node)];
      if (node.children.empty() || ctx_.no_split->Contains(tied_entry.node)) continue;
      Explain(fmt::format("Splitting {}.", tied_names[k]));
      std::vector<Entry> children =
          ExpandModule(tree_, tied_entry.node, ctx_.fixes.requeue_split_buffers);
      for (auto it = todo_.begin(); it != todo_.end(); ++it) {
        if (it->name == tied_names[k]) {
          auto at = todo_.erase(it);
          todo_.insert(at, children.begin(), children.end());
          break;
        }
      }
      todo_.push_front(std::move(entry));
      layers_.Recompute(todo_, /*with_tensors=*/false);
      return true;
    }
    Explain("None of the tied module can be split, going to the next device.");
  }

  if (used + size >= cap) {
    bool has_children =
        entry.is_module() && !tree_.nodes[static_cast<size_t>(entry.node)].children.empty();
    Explain(fmt::format("Not enough space on {} to put {} (space available {}, module size {}).",
                        device.ToKey(), name, (cap - used).Repr(), size.Repr()));
    if (!has_children || ctx_.no_split->Contains(entry.node)) {
      Explain("This module cannot be split, going to the next device.");
    } else {
      Explain(fmt::format("Splitting {}.", name));
      PushFront(ExpandModule(tree_, entry.node, ctx_.fixes.requeue_split_buffers));
      layers_.Recompute(todo_, /*with_tensors=*/false);
      return true;
    }
  }

  if (used == PyNum() && ctx_.fallback_allocation && !unlimited) {
    PyNum limit = FindBudget(budgets_, device)->bytes - PyMax(layers_.max_size(), with_ties);
    Entry found;
    if (FallbackAllocate(ctx_, &todo_, limit - used, &found)) {
      todo_.push_front(std::move(entry));
      todo_.push_front(std::move(found));
      return true;
    }
  }

  if (used == PyNum()) AddTo(&out_.min_required, device, with_ties + reserved);
  used += reserved;
  ++dev_i_;
  todo_.push_front(std::move(entry));
  return dev_i_ < devices_.size();
}

}  // namespace

void OrderedPlacement::Set(const std::string& name, Device device) {
  auto [it, inserted] = index_.emplace(name, entries_.size());
  if (inserted) {
    entries_.push_back(DeviceMap::Entry{name, device});
  } else {
    entries_[it->second].device = device;
  }
}

std::vector<Device> PlacementDevices(const Budgets& budgets) {
  std::vector<Device> devices;
  bool has_disk = false;
  for (const Budget& b : budgets) {
    devices.push_back(b.device);
    has_disk = has_disk || b.device.type == Device::Type::kDisk;
  }
  if (!has_disk) devices.push_back(Device::Disk());
  return devices;
}

Placement GreedyPlace(const PlanContext& ctx, const Budgets& budgets) {
  return Greedy(ctx, budgets).Run();
}

}  // namespace loadstone::device_map
