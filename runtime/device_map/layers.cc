#include "runtime/device_map/layers.h"

#include <algorithm>
#include <unordered_set>

namespace loadstone::device_map {

Entry ModuleEntry(const ModuleTree::Impl& tree, int32_t node) {
  return Entry{std::string(tree.nodes[static_cast<size_t>(node)].name), node, -1};
}

Entry TensorEntry(const ModuleTree::Impl& tree, int32_t tensor) {
  return Entry{std::string(tree.tensors[static_cast<size_t>(tensor)].name), -1, tensor};
}

std::vector<Entry> ExpandModule(const ModuleTree::Impl& tree, int32_t node, bool with_buffers) {
  const TreeNode& tn = tree.nodes[static_cast<size_t>(node)];
  std::vector<Entry> out;
  out.reserve(tn.params.size() + tn.children.size() + (with_buffers ? tn.buffers.size() : 0));
  std::unordered_set<int32_t> seen_storage;
  for (int32_t t : tn.params) {
    if (seen_storage.insert(tree.tensors[static_cast<size_t>(t)].storage).second) {
      out.push_back(TensorEntry(tree, t));
    }
  }
  for (int32_t c : tn.children) out.push_back(ModuleEntry(tree, c));
  if (with_buffers) {
    for (int32_t t : tn.buffers) out.push_back(TensorEntry(tree, t));
  }
  return out;
}

Todo InitialTodo(const ModuleTree::Impl& tree) {
  std::vector<Entry> first = ExpandModule(tree, 0, /*with_buffers=*/true);
  return Todo(first.begin(), first.end());
}

LayerTracker::LayerTracker(const ModuleTree::Impl& tree, const ModuleSizes& sizes,
                           const NoSplit& no_split)
    : tree_(tree), sizes_(sizes), agg_(tree.nodes.size()), is_layer_(tree.nodes.size()) {
  // Children come after their parent in pre-order: visit it backwards.
  for (auto it = tree.nodes_by_pre.rbegin(); it != tree.nodes_by_pre.rend(); ++it) {
    int32_t id = *it;
    auto n = static_cast<size_t>(id);
    const TreeNode& node = tree.nodes[n];
    is_layer_[n] = node.children.empty() || no_split.Contains(id);
    if (is_layer_[n]) {
      agg_[n] = sizes.node[n];
      continue;
    }
    PyNum best = agg_[static_cast<size_t>(node.children.front())];
    for (int32_t c : node.children) best = PyMax(best, agg_[static_cast<size_t>(c)]);
    agg_[n] = best;
  }
}

PyNum LayerTracker::EntrySize(const Entry& e) const {
  return e.is_module() ? sizes_.node[static_cast<size_t>(e.node)]
                       : sizes_.tensor[static_cast<size_t>(e.tensor)];
}

std::pair<int32_t, int32_t> LayerTracker::Range(const Entry& e) const {
  if (e.is_module()) {
    const TreeNode& node = tree_.nodes[static_cast<size_t>(e.node)];
    return {node.pre, node.end};
  }
  int32_t pre = tree_.tensor_pre[static_cast<size_t>(e.tensor)];
  return {pre, pre + 1};
}

void LayerTracker::CollectNames(int32_t id) {
  // Only subtrees whose largest layer equals max_size_ hold names.
  std::vector<int32_t> stack = {id};
  while (!stack.empty()) {
    auto n = static_cast<size_t>(stack.back());
    stack.pop_back();
    if (!(agg_[n] == max_size_)) continue;
    if (is_layer_[n]) {
      names_.push_back(tree_.nodes[n].pre);
      continue;
    }
    for (int32_t c : tree_.nodes[n].children) stack.push_back(c);
  }
}

void LayerTracker::Recompute(const Todo& todo, bool with_tensors) {
  PyNum best;  // int 0, as accelerate starts
  for (const Entry& e : todo) {
    if (!e.is_module() && !with_tensors) continue;
    PyNum size = e.is_module() ? agg_[static_cast<size_t>(e.node)] : EntrySize(e);
    best = PyMax(best, size);
  }
  max_size_ = best;
  names_.clear();
  for (const Entry& e : todo) {
    if (e.is_module()) {
      CollectNames(e.node);
    } else if (with_tensors && EntrySize(e) == max_size_) {
      names_.push_back(tree_.tensor_pre[static_cast<size_t>(e.tensor)]);
    }
  }
  std::sort(names_.begin(), names_.end());
  removed_.assign(names_.size(), false);
  live_ = names_.size();
}

void LayerTracker::Pop(const Entry& popped, const Todo& todo) {
  auto [begin, end] = Range(popped);
  for (auto it = std::lower_bound(names_.begin(), names_.end(), begin);
       it != names_.end() && *it < end; ++it) {
    auto i = static_cast<size_t>(it - names_.begin());
    if (!removed_[i]) {
      removed_[i] = true;
      --live_;
    }
  }
  if (live_ == 0) Recompute(todo, /*with_tensors=*/false);
}

}  // namespace loadstone::device_map
