// The model side of the LibTorch face (include/loadstone/torch.h): dtypes, a module described
// for the planner, device-map arguments as diffusers takes them, a module's state dict and
// save_pretrained.
#include "loadstone/torch.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/version.h>

#include "internal.h"  // beside this file: the binding sees loadstone's public headers only
#include "loadstone/model.h"
#include "loadstone/writer.h"

namespace loadstone::libtorch {
namespace {

namespace fs = std::filesystem;

std::string JoinName(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : fmt::format("{}.{}", prefix, name);
}

// The non-persistent buffers of `module` and its descendants, as full dotted names.
void CollectNonPersistent(const torch::nn::Module& module, const std::string& prefix,
                          std::unordered_set<std::string>* out) {
  if (const auto* traits = dynamic_cast<const ModelTraits*>(&module)) {
    for (const std::string& b : traits->non_persistent_buffers()) out->insert(JoinName(prefix, b));
  }
  for (const auto& child : module.named_children()) {
    CollectNonPersistent(*child.value(), JoinName(prefix, child.key()), out);
  }
}

// PyTorch's state-dict order: a module's parameters, its persistent buffers, then its children.
void CollectStateDict(const torch::nn::Module& module, const std::string& prefix,
                      const std::unordered_set<std::string>& non_persistent,
                      std::vector<std::pair<std::string, at::Tensor>>* out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    out->emplace_back(JoinName(prefix, p.key()), p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    std::string name = JoinName(prefix, b.key());
    if (!non_persistent.contains(name)) out->emplace_back(std::move(name), b.value());
  }
  for (const auto& child : module.named_children()) {
    CollectStateDict(*child.value(), JoinName(prefix, child.key()), non_persistent, out);
  }
}

// ---- model description -------------------------------------------------------------------

struct Describer {
  std::unordered_set<std::string> non_persistent;
  // Parameters by storage (data pointer, dtype, shape, strides): the first name is the source.
  std::map<std::tuple<const void*, int, std::vector<int64_t>, std::vector<int64_t>>,
           std::vector<std::string>>
      by_storage;

  Result<nlohmann::ordered_json> Leaf(const std::string& local, const at::Tensor& t) {
    LOADSTONE_ASSIGN_OR_RETURN(const DType dtype, FromScalarType(t.scalar_type()));
    nlohmann::ordered_json j = {{"name", local}, {"shape", t.sizes().vec()},
                                {"dtype", std::string(TorchName(dtype))}};
    return j;
  }

  Result<nlohmann::ordered_json> Module(const torch::nn::Module& m, const std::string& name,
                                        const std::string& prefix) {
    nlohmann::ordered_json j = {{"name", name}, {"class", ClassName(m)}};
    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const auto& p : m.named_parameters(false)) {
      LOADSTONE_ASSIGN_OR_RETURN(nlohmann::ordered_json t, Leaf(p.key(), p.value()));
      params.push_back(std::move(t));
      const at::Tensor& v = p.value();
      if (v.defined() && v.numel() > 0) {
        by_storage[{v.data_ptr(), static_cast<int>(v.scalar_type()), v.sizes().vec(),
                    v.strides().vec()}]
            .push_back(JoinName(prefix, p.key()));
      }
    }
    nlohmann::ordered_json buffers = nlohmann::ordered_json::array();
    for (const auto& b : m.named_buffers(false)) {
      LOADSTONE_ASSIGN_OR_RETURN(nlohmann::ordered_json t, Leaf(b.key(), b.value()));
      t["persistent"] = !non_persistent.contains(JoinName(prefix, b.key()));
      buffers.push_back(std::move(t));
    }
    nlohmann::ordered_json children = nlohmann::ordered_json::array();
    for (const auto& c : m.named_children()) {
      LOADSTONE_ASSIGN_OR_RETURN(nlohmann::ordered_json child,
                                 Module(*c.value(), c.key(), JoinName(prefix, c.key())));
      children.push_back(std::move(child));
    }
    j["params"] = std::move(params);
    j["buffers"] = std::move(buffers);
    j["children"] = std::move(children);
    return j;
  }
};

}  // namespace

// "loadstone::testing::BasicTransformerBlockImpl" → "BasicTransformerBlock".
std::string ClassName(const torch::nn::Module& module) {
  std::string name = module.name();
  if (size_t colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.ends_with("Impl")) name.resize(name.size() - 4);
  return name;
}

// ---- dtypes --------------------------------------------------------------------------------

Result<c10::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBool: return at::kBool;
    case DType::kU8: return at::kByte;
    case DType::kI8: return at::kChar;
    case DType::kI16: return at::kShort;
    case DType::kI32: return at::kInt;
    case DType::kI64: return at::kLong;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF32: return at::kFloat;
    case DType::kF64: return at::kDouble;
    case DType::kC64: return at::kComplexFloat;
    default: break;
  }
  return Status::Unsupported(fmt::format(
      "dtype {}: LibTorch {}.{} has no such element type; load it with loadstone's Loader "
      "(raw bytes) or cast it (dtype)",
      TorchName(dtype), TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
}

Result<DType> FromScalarType(c10::ScalarType type) {
  switch (type) {
    case at::kBool: return DType::kBool;
    case at::kByte: return DType::kU8;
    case at::kChar: return DType::kI8;
    case at::kShort: return DType::kI16;
    case at::kInt: return DType::kI32;
    case at::kLong: return DType::kI64;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kFloat: return DType::kF32;
    case at::kDouble: return DType::kF64;
    case at::kComplexFloat: return DType::kC64;
    default: break;
  }
  return Status::Unsupported(
      fmt::format("LibTorch dtype {}: loadstone has no such element type", c10::toString(type)));
}

// ---- description ---------------------------------------------------------------------------

Result<std::string> DescribeModuleJson(const torch::nn::Module& module) {
  Describer d;
  CollectNonPersistent(module, "", &d.non_persistent);
  LOADSTONE_ASSIGN_OR_RETURN(nlohmann::ordered_json root, d.Module(module, "", ""));
  nlohmann::ordered_json tied = nlohmann::ordered_json::array();
  std::vector<std::vector<std::string>> groups;
  for (auto& [key, names] : d.by_storage) {
    if (names.size() > 1) groups.push_back(names);
  }
  std::sort(groups.begin(), groups.end());
  for (const auto& g : groups) tied.push_back(g);
  nlohmann::ordered_json doc = {{"modules", std::move(root)}, {"tied", std::move(tied)}};
  return doc.dump();
}

Result<ModelDescription> DescribeModule(const torch::nn::Module& module) {
  LOADSTONE_ASSIGN_OR_RETURN(const std::string json, DescribeModuleJson(module));
  return ParseModelDescription(json);
}

Result<std::vector<std::string>> NoSplitModules(const torch::nn::Module& module,
                                                std::string_view mode) {
  std::set<std::string> classes;
  std::vector<const torch::nn::Module*> stack = {&module};
  while (!stack.empty()) {
    const torch::nn::Module* m = stack.back();
    stack.pop_back();
    const std::string name = ClassName(*m);
    if (classes.contains(name)) continue;
    const auto* traits = dynamic_cast<const ModelTraits*>(m);
    if (traits != nullptr || m == &module) {
      auto declared = traits ? traits->no_split_modules() : std::nullopt;
      if (!declared) {
        return Status::InvalidArgument(fmt::format(
            "{} does not support `device_map='{}'`. To implement support, the model class needs "
            "to implement the `_no_split_modules` attribute.",
            name, mode));
      }
      classes.insert(declared->begin(), declared->end());
    }
    for (const auto& child : m->children()) stack.push_back(child.get());
  }
  return std::vector<std::string>(classes.begin(), classes.end());
}

// ---- device maps ---------------------------------------------------------------------------

Result<NormalizedDeviceMap> NormalizeDeviceMap(const DeviceMapArg& arg) {
  NormalizedDeviceMap out;
  auto whole = [&](Device d) -> Result<NormalizedDeviceMap> {
    DeviceMap map;
    LOADSTONE_RETURN_IF_ERROR(map.Add("", d));
    out.map = std::move(map);
    return out;
  };
  auto from_torch = [&](const c10::Device& d) -> Result<NormalizedDeviceMap> {
    if (d.is_cpu()) return whole(Device::Cpu());
    if (d.is_cuda()) return whole(Device::Cuda(d.has_index() ? d.index() : 0));
    return Status::InvalidArgument(fmt::format(
        "device_map {}: loadstone places tensors on CUDA GPUs, the CPU and disk", d.str()));
  };
  if (std::holds_alternative<std::monostate>(arg.value)) return whole(Device::Cpu());
  if (const auto* index = std::get_if<int64_t>(&arg.value)) {
    if (*index < 0) {
      return Status::InvalidArgument(
          "You can't pass device_map as a negative int. If you want to put the model on the cpu, "
          "pass device_map = 'cpu' ");
    }
    if (*index > 1 << 20) return Status::InvalidArgument(fmt::format("device_map {}: no such GPU", *index));
    return whole(Device::Cuda(static_cast<int>(*index)));
  }
  if (const auto* device = std::get_if<c10::Device>(&arg.value)) return from_torch(*device);
  if (const auto* map = std::get_if<DeviceMap>(&arg.value)) {
    out.map = *map;
    return out;
  }
  const std::string& name = std::get<std::string>(arg.value);
  if (name == "auto" || name == "balanced" || name == "balanced_low_0" || name == "sequential") {
    out.mode = name;
    return out;
  }
  try {
    return from_torch(c10::Device(name));
  } catch (const c10::Error&) {
    return Status::InvalidArgument(fmt::format(
        "When passing device_map as a string, the value needs to be a device name (e.g. cpu, "
        "cuda:0) or 'auto', 'balanced', 'balanced_low_0', 'sequential' but found {}.",
        name));
  }
}

std::vector<std::pair<std::string, at::Tensor>> PersistentStateDict(const torch::nn::Module& model) {
  std::unordered_set<std::string> non_persistent;
  CollectNonPersistent(model, "", &non_persistent);
  std::vector<std::pair<std::string, at::Tensor>> out;
  CollectStateDict(model, "", non_persistent, &out);
  return out;
}

// ---- saving --------------------------------------------------------------------------------

namespace {

// Each tensor of `state` made a contiguous CPU tensor, in place, and described for the writer;
// the descriptions' data points into `state`, which must outlive them.
Result<std::vector<TensorToWrite>> ToWrite(std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::vector<TensorToWrite> tensors;
  tensors.reserve(state.size());
  for (auto& [name, t] : state) {
    t = t.detach().to(at::kCPU).contiguous();
    LOADSTONE_ASSIGN_OR_RETURN(const DType dtype, FromScalarType(t.scalar_type()));
    TensorToWrite w;
    w.name = name;
    w.dtype = dtype;
    for (int64_t d : t.sizes()) w.shape.push_back(static_cast<uint64_t>(d));
    w.data = std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes());
    tensors.push_back(std::move(w));
  }
  return tensors;
}

// .bin: torch.save-compatible archives in `folder` (created if missing), one per shard, and the
// index when sharded; the paths written. `tensors` describe `state`, index for index.
Result<std::vector<std::string>> SaveBin(
    const std::string& folder, const std::vector<std::pair<std::string, at::Tensor>>& state,
    const std::vector<TensorToWrite>& tensors, const SaveOptions& options) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return Status::IOError(fmt::format("cannot create '{}': {}", folder, ec.message()));
  const auto shards = SplitIntoShards(tensors, options.max_shard_size);
  const std::string variant = options.variant.empty() ? "" : "." + options.variant;
  std::vector<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1
            ? fmt::format("{}{}.bin", options.prefix, variant)
            : fmt::format("{}{}-{:05d}-of-{:05d}.bin", options.prefix, variant, s + 1, shards.size());
    c10::Dict<std::string, at::Tensor> dict;
    for (size_t i : shards[s]) {
      dict.insert(state[i].first, state[i].second);
      weight_map[state[i].first] = file;
      total += tensors[i].nbytes();
    }
    const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
    const std::string path = (fs::path(folder) / file).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.good()) return Status::IOError(fmt::format("cannot write '{}'", path));
    written.push_back(path);
  }
  if (shards.size() > 1) {
    const std::string index =
        (fs::path(folder) / fmt::format("{}.bin.index{}.json", options.prefix, variant)).string();
    nlohmann::ordered_json doc = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream out(index, std::ios::trunc);
    out << doc.dump(2);
    if (!out.good()) return Status::IOError(fmt::format("cannot write '{}'", index));
    written.push_back(index);
  }
  return written;
}

}  // namespace

Result<std::vector<std::string>> SavePretrained(const torch::nn::Module& model,
                                                const std::string& folder,
                                                const SaveOptions& options) {
  return Guarded("save_pretrained", [&]() -> Result<std::vector<std::string>> {
    std::vector<std::pair<std::string, at::Tensor>> state = PersistentStateDict(model);
    LOADSTONE_ASSIGN_OR_RETURN(const std::vector<TensorToWrite> tensors, ToWrite(state));
    if (options.safe_serialization) {
      ShardedWriteOptions w;
      w.prefix = options.prefix;
      w.variant = options.variant;
      w.max_shard_size = options.max_shard_size;
      w.metadata = {{"format", "pt"}};
      return WriteShardedSafetensors(folder, tensors, w);
    }
    return SaveBin(folder, state, tensors, options);
  });
}

}  // namespace loadstone::libtorch
