#include "runtime/device_map/module_sizes.h"

namespace loadstone::device_map {
namespace {

bool IsReducedFloat(DType dtype) { return IsFloatingPoint(dtype) && DTypeBits(dtype) < 32; }

// The size of one tensor under the policy; `name` is the name special dtypes are looked up by.
PyNum TensorSize(const Storage& storage, std::string_view full_name, std::string_view lookup_name,
                 const SizePolicy& policy) {
  auto numel = PyNum::Int(static_cast<int64_t>(storage.numel));
  if (policy.placed) {
    if (auto it = policy.placed->find(full_name); it != policy.placed->end()) {
      return PyNum::Int(static_cast<int64_t>(it->second.numel)) *
             ElemByteSize(ElemType{it->second.dtype, CustomType::kNone});
    }
  }
  if (!policy.special_dtypes.empty()) {
    if (auto it = policy.special_dtypes.find(std::string(lookup_name));
        it != policy.special_dtypes.end()) {
      return numel * ElemByteSize(ElemType{it->second, CustomType::kNone});
    }
  }
  if (!policy.dtype) return numel * ElemByteSize(storage.type);
  if (KeepsOwnSize(storage.type)) return numel * ElemByteSize(storage.type);
  if (IsReducedFloat(*policy.dtype) && storage.type.custom == CustomType::kNone &&
      IsFloatingPoint(storage.type.dtype)) {
    for (const std::string& key : policy.keep_in_fp32) {
      if (MatchesModulePattern(full_name, key)) return numel * PyNum::Int(4);
    }
  }
  return numel * PyMin(ElemByteSize(ElemType{*policy.dtype, CustomType::kNone}),
                       ElemByteSize(storage.type));
}

}  // namespace

std::optional<ElemType> ParseElemType(std::string_view name) {
  std::string_view bare = name.substr(0, 6) == "torch." ? name.substr(6) : name;
  if (bare == "int4") return ElemType{DType::kU8, CustomType::kInt4};
  if (bare == "int2") return ElemType{DType::kU8, CustomType::kInt2};
  if (std::optional<DType> dtype = ParseDType(name)) return ElemType{*dtype, CustomType::kNone};
  return std::nullopt;
}

PyNum ElemByteSize(ElemType type) {
  if (type.custom == CustomType::kInt4) return PyNum::Float(0.5);
  if (type.custom == CustomType::kInt2) return PyNum::Float(0.25);
  if (type.dtype == DType::kBool) return PyNum::Float(0.125);
  int bits = DTypeBits(type.dtype);
  if (bits % 8 != 0) return PyNum::Float(bits / 8.0);  // packed float4 / float6
  return PyNum::Int(bits / 8);
}

bool KeepsOwnSize(ElemType type) {
  return type.custom == CustomType::kNone && (type.dtype == DType::kBool || IsInteger(type.dtype));
}

PyNum ModuleSizes::Of(const ModuleTree::Impl& tree, std::string_view name) const {
  if (int32_t t = tree.FindTensor(name); t >= 0) return tensor[static_cast<size_t>(t)];
  if (int32_t n = tree.FindNode(name); n >= 0) return node[static_cast<size_t>(n)];
  return PyNum();
}

ModuleSizes ComputeModuleSizes(const ModuleTree::Impl& tree, const SizePolicy& policy) {
  ModuleSizes sizes;
  sizes.node.assign(tree.nodes.size(), PyNum());
  sizes.tensor.assign(tree.tensors.size(), PyNum());
  sizes.storage.assign(tree.storages.size(), PyNum());
  std::vector<bool> touched(tree.nodes.size(), false);
  std::vector<int32_t> path;
  for (int32_t t : tree.SizedTensors()) {
    const TreeTensor& tensor = tree.tensors[static_cast<size_t>(t)];
    auto storage = static_cast<size_t>(tensor.storage);
    PyNum size = TensorSize(tree.storages[storage], tensor.name, tensor.name, policy);
    sizes.tensor[static_cast<size_t>(t)] = size;
    sizes.storage[storage] = size;
    path.clear();
    for (int32_t n = tensor.node; n >= 0; n = tree.nodes[static_cast<size_t>(n)].parent) {
      path.push_back(n);
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      auto n = static_cast<size_t>(*it);
      sizes.node[n] += size;
      if (!touched[n]) {
        touched[n] = true;
        sizes.node_order.push_back(*it);
      }
    }
  }
  return sizes;
}

PyNum ModuleBufferSize(const ModuleTree::Impl& tree, int32_t node, const SizePolicy& policy) {
  const std::string_view module_name = tree.nodes[static_cast<size_t>(node)].name;
  size_t strip = module_name.empty() ? 0 : module_name.size() + 1;
  PyNum total;
  std::vector<int32_t> stack = {node};
  std::vector<int32_t> order;
  while (!stack.empty()) {
    int32_t n = stack.back();
    stack.pop_back();
    order.push_back(n);
    const TreeNode& tn = tree.nodes[static_cast<size_t>(n)];
    for (auto it = tn.children.rbegin(); it != tn.children.rend(); ++it) stack.push_back(*it);
  }
  for (int32_t n : order) {
    for (int32_t t : tree.nodes[static_cast<size_t>(n)].buffers) {
      const TreeTensor& tensor = tree.tensors[static_cast<size_t>(t)];
      std::string_view relative = std::string_view(tensor.name).substr(strip);
      total += TensorSize(tree.storages[static_cast<size_t>(tensor.storage)], tensor.name,
                          relative, policy);
    }
  }
  return total;
}

}  // namespace loadstone::device_map

namespace loadstone {

bool MatchesModulePattern(std::string_view name, std::string_view key) {
  if (key.empty()) return false;
  for (size_t pos = name.find(key); pos != std::string_view::npos; pos = name.find(key, pos + 1)) {
    size_t after = pos + key.size();
    if ((pos == 0 || name[pos - 1] == '.') && (after == name.size() || name[after] == '.')) {
      return true;
    }
  }
  return false;
}

}  // namespace loadstone
