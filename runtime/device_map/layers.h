// The work list of infer_auto_device_map and its "largest layer" bookkeeping
// (get_max_layer_size), kept fast for trees of 100,000+ tensors.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_LAYERS_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_LAYERS_H_

#include <deque>
#include <string>
#include <vector>

#include "runtime/device_map/module_sizes.h"
#include "runtime/device_map/module_tree.h"
#include "runtime/device_map/no_split.h"
#include "runtime/device_map/py_number.h"

namespace loadstone::device_map {

// A (name, module-or-tensor) pair of accelerate's modules_to_treat.
struct Entry {
  std::string name;
  int32_t node = -1;    // a module, or
  int32_t tensor = -1;  // a parameter / buffer

  bool is_module() const { return node >= 0; }
};

using Todo = std::deque<Entry>;

Entry ModuleEntry(const ModuleTree::Impl& tree, int32_t node);
Entry TensorEntry(const ModuleTree::Impl& tree, int32_t tensor);

// named_parameters(recurse=False) + named_children() [+ named_buffers(recurse=False)].
std::vector<Entry> ExpandModule(const ModuleTree::Impl& tree, int32_t node, bool with_buffers);

// The root's direct parameters, children, direct buffers (the initial modules_to_treat).
Todo InitialTodo(const ModuleTree::Impl& tree);

// get_max_layer_size with per-module aggregates computed once. A layer is a tensor, a module
// without children, or a no-split module.
class LayerTracker {
 public:
  LayerTracker(const ModuleTree::Impl& tree, const ModuleSizes& sizes, const NoSplit& no_split);

  PyNum EntrySize(const Entry& e) const;

  // Recomputes the largest layer over `todo` (module entries only unless `with_tensors`).
  void Recompute(const Todo& todo, bool with_tensors);
  // accelerate: max_layer_names = [n for n in names if n != name and not n.startswith(name+".")];
  // recomputes over the module entries of `todo` when that leaves none.
  void Pop(const Entry& popped, const Todo& todo);

  PyNum max_size() const { return max_size_; }

 private:
  void CollectNames(int32_t node);
  std::pair<int32_t, int32_t> Range(const Entry& e) const;

  const ModuleTree::Impl& tree_;
  const ModuleSizes& sizes_;
  std::vector<PyNum> agg_;  // per module: the first largest layer size in its subtree
  std::vector<bool> is_layer_;
  PyNum max_size_;
  // Pre-order numbers of the layers realising max_size_, sorted, with removed ones marked.
  std::vector<int32_t> names_;
  std::vector<bool> removed_;
  size_t live_ = 0;
};

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_LAYERS_H_
