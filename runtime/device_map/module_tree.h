// The module tree behind loadstone::ModuleTree: modules, tensors (parameters and buffers) and
// the storages they share when tied, in torch's registration order.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_TREE_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_TREE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/formats/limits.h"
#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::device_map {

// Bounds on the names a module tree takes, checked before anything is stored for a name. They
// keep planning linear in its input: a tree's names are views into one copy of each tensor
// name, but the greedy walk descends a module's path one component at a time.
inline constexpr size_t kMaxNameBytes = io::kMaxTensorNameBytes;  // a dotted tensor or module name
inline constexpr size_t kMaxNameDepth = 128;   // its dotted components

// Owns the names of a tree. A name it returns keeps its address for the arena's life (names
// live in blocks that never move), so the tree and its indexes hold views.
class NameArena {
 public:
  std::string_view Add(std::string_view text);

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
  char* next_ = nullptr;
  size_t left_ = 0;
};

// Element types beyond DType that accelerate sizes specially (CustomDtype).
enum class CustomType : uint8_t { kNone, kInt4, kInt2 };

struct ElemType {
  DType dtype = DType::kF32;
  CustomType custom = CustomType::kNone;
};

// One tensor object; tied names share one.
struct Storage {
  uint64_t numel = 0;
  ElemType type;
};

struct TreeTensor {
  std::string_view name;  // full dotted name (in the tree's NameArena)
  int32_t node = 0;  // owning module
  int32_t storage = 0;
  bool is_buffer = false;
  bool persistent = true;  // buffers only
};

struct TreeNode {
  std::string_view name;  // full dotted name (in the tree's NameArena); "" for the root
  std::string class_name;
  int32_t parent = -1;
  std::vector<int32_t> children;
  std::vector<int32_t> params;   // direct parameters, registration order (tied names included)
  std::vector<int32_t> buffers;  // direct buffers
  // Pre-order numbering over modules and tensors (a module, its params, its children, its
  // buffers): the module's subtree is [pre, end).
  int32_t pre = 0;
  int32_t end = 0;
};

}  // namespace loadstone::device_map

namespace loadstone {

struct ModuleTree::Impl {
  device_map::NameArena names;             // every name below
  std::vector<device_map::TreeNode> nodes;  // nodes[0] is the root
  std::vector<device_map::TreeTensor> tensors;
  std::vector<device_map::Storage> storages;
  std::vector<int32_t> tensor_pre;     // pre-order number of each tensor
  std::vector<int32_t> nodes_by_pre;   // modules in pre-order (named_modules order)
  bool has_classes = false;
  // Name → index; filled by Finish(), and by AddTensor once Finish() has run.
  std::unordered_map<std::string_view, int32_t> node_by_name;
  std::unordered_map<std::string_view, int32_t> tensor_by_name;
  bool indexed = false;  // Finish() has run

  // `local` under module `node`, as a full dotted name in `names`.
  // Errors: InvalidArgument past kMaxNameBytes or kMaxNameDepth (`what` names the entry).
  Result<std::string_view> ChildName(int32_t node, std::string_view local, std::string_view what);
  // Adds a child module / tensor named `full_name` (a view into `names`; no checks). Finish()
  // numbers the tree and fills the indexes; a tensor added after it is indexed at once (call
  // Finish() again before numbering is used).
  int32_t AddNode(int32_t parent, std::string_view full_name, std::string class_name);
  int32_t AddTensor(int32_t node, std::string_view full_name, int32_t storage, bool is_buffer,
                    bool persistent);
  void Finish();

  // named_parameters(recurse=True) then named_buffers(recurse=True), without repeats of a tied
  // storage: the tensors accelerate's compute_module_sizes walks, in its order.
  std::vector<int32_t> SizedTensors() const;
  int32_t FindNode(std::string_view name) const;    // -1 when absent
  int32_t FindTensor(std::string_view name) const;  // -1 when absent
};

// How the planner makes trees and reads them (ModuleTree's constructor is private).
struct ModuleTreeAccess {
  static ModuleTree Make(std::shared_ptr<const ModuleTree::Impl> impl) {
    return ModuleTree(std::move(impl));
  }
  static const ModuleTree::Impl& Get(const ModuleTree& tree) { return *tree.impl_; }
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_TREE_H_
