// Module sizes under the dtype policy: accelerate's dtype_byte_size and compute_module_sizes,
// plus loadstone's keep_in_fp32 rule.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_SIZES_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_SIZES_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loadstone/device_map.h"
#include "runtime/device_map/module_tree.h"
#include "runtime/device_map/py_number.h"

namespace loadstone::device_map {

// A DType name (ParseDType) or accelerate's custom "int4" / "int2".
std::optional<ElemType> ParseElemType(std::string_view name);

// dtype_byte_size: bool 1/8, int2 1/4, int4 1/2 (floats, as in Python), float8 1, else bits/8.
PyNum ElemByteSize(ElemType type);

// True for the types accelerate never converts (torch.uint*, torch.int*, torch.bool).
bool KeepsOwnSize(ElemType type);


// How a load will place a tensor: `numel` elements of `dtype` (a dequantized packed tensor has
// the elements of its element shape, not of its bytes).
struct PlacedTensor {
  DType dtype = DType::kF32;
  uint64_t numel = 0;
};
// Full tensor name → how a load will place it (InferDeviceMapPlaced in infer.h).
using PlacedTensors = std::unordered_map<std::string_view, PlacedTensor>;

struct SizePolicy {
  std::optional<DType> dtype;
  std::map<std::string, DType> special_dtypes;
  std::vector<std::string> keep_in_fp32;
  // Tensors sized as their PlacedTensor says, before any rule above (null: none).
  const PlacedTensors* placed = nullptr;
};

struct ModuleSizes {
  std::vector<PyNum> node;    // per module; 0 for a module without tensors
  std::vector<PyNum> tensor;  // per tensor name; 0 for the later names of a tied storage
  std::vector<PyNum> storage;
  // Modules in the order their names first enter accelerate's module_sizes dict.
  std::vector<int32_t> node_order;

  // S[name] for a module or tensor name (0 when absent, like the defaultdict).
  PyNum Of(const ModuleTree::Impl& tree, std::string_view name) const;
};

ModuleSizes ComputeModuleSizes(const ModuleTree::Impl& tree, const SizePolicy& policy);

// compute_module_total_buffer_size(module): the buffers below `node`, special dtypes looked up
// by their names relative to the module (as accelerate does).
PyNum ModuleBufferSize(const ModuleTree::Impl& tree, int32_t node, const SizePolicy& policy);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_MODULE_SIZES_H_
