// The module tree behind loadstone::ModuleTree: modules, tensors (parameters and buffers) and
// the storages they share when tied, in torch's registration order.
#ifndef LOADSTONE_RUNTIME_PLANNER_MODULE_TREE_H_
#define LOADSTONE_RUNTIME_PLANNER_MODULE_TREE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loadstone/device_map.h"
#include "loadstone/dtype.h"

namespace loadstone::planner {

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
  std::string name;  // full dotted name
  int32_t node = 0;  // owning module
  int32_t storage = 0;
  bool is_buffer = false;
  bool persistent = true;  // buffers only
};

struct TreeNode {
  std::string name;  // full dotted name; "" for the root
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

}  // namespace loadstone::planner

namespace loadstone {

struct ModuleTree::Impl {
  std::vector<planner::TreeNode> nodes;  // nodes[0] is the root
  std::vector<planner::TreeTensor> tensors;
  std::vector<planner::Storage> storages;
  std::vector<int32_t> tensor_pre;     // pre-order number of each tensor
  std::vector<int32_t> nodes_by_pre;   // modules in pre-order (named_modules order)
  bool has_classes = false;
  // Views of the names above; rebuilt by Finish(), valid while the vectors stay unchanged.
  std::unordered_map<std::string_view, int32_t> node_by_name;
  std::unordered_map<std::string_view, int32_t> tensor_by_name;

  // Adds a child module / tensor (no checks); Finish() numbers the tree and fills the indexes.
  int32_t AddNode(int32_t parent, std::string_view local, std::string class_name);
  int32_t AddTensor(int32_t node, std::string_view local, int32_t storage, bool is_buffer,
                    bool persistent);
  void Finish();

  // named_parameters(recurse=True) then named_buffers(recurse=True), without repeats of a tied
  // storage: the tensors accelerate's compute_module_sizes walks, in its order.
  std::vector<int32_t> SizedTensors() const;
  int32_t FindNode(std::string_view name) const;    // -1 when absent
  int32_t FindTensor(std::string_view name) const;  // -1 when absent
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_PLANNER_MODULE_TREE_H_
