// The load path of the LibTorch face (include/loadstone/torch.h): one casting rule, a plan and a
// load through loadstone's Loader, and the loaded tensors handed over as at::Tensors — as a
// state dict, or filled into a module with its missing and unexpected keys.
#include "loadstone/torch.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"  // beside this file: the binding sees loadstone's public headers only
#include "model_keys.h"
#include "loadstone/model.h"
#include "loadstone/plan.h"
#include "loadstone/state_dict.h"

namespace loadstone::libtorch {
namespace {

// ---- the one load path ---------------------------------------------------------------------

// diffusers' keep_in_fp32 rule: one component of the dotted name equals one of `modules`.
bool KeptInFp32(std::string_view name, const std::vector<std::string>& modules) {
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    const std::string_view part = name.substr(start, dot - start);
    if (std::find(modules.begin(), modules.end(), part) != modules.end()) return true;
    start = dot + 1;
  }
  return false;
}

// What one tensor becomes: the dtype the plan loads it as, and a LibTorch cast after that when
// the target is one loadstone does not cast to (float64, say).
struct CastRule {
  std::map<std::string, DType> special;        // for PlanOptions::special_dtypes
  std::map<std::string, c10::ScalarType> after;  // cast by LibTorch once loaded
};

// The one casting rule. `model`: the model tensor each checkpoint tensor fills, by the
// checkpoint tensor's name (LoadInto), else empty.
Result<CastRule> CastTargets(const Checkpoint& checkpoint, const std::unordered_set<std::string>* include,
                             const TorchLoadOptions& options,
                             const std::vector<std::string>& keep_in_fp32,
                             const std::unordered_map<std::string, at::Tensor>& model) {
  CastRule rule;
  std::optional<DType> target_all;
  if (options.dtype) {
    LOADSTONE_ASSIGN_OR_RETURN(target_all, FromScalarType(*options.dtype));
  }
  for (const TensorInfo& t : checkpoint.tensors()) {
    if (include && !include->contains(t.name)) continue;
    // Integer and bool tensors never cast; float8 weights neither (diffusers skips e4m3fn). A
    // packed quantized weight (GGUF blocks, bitsandbytes, ...) or a float8 one with scales is
    // dequantized into the target.
    const bool packed = checkpoint.Dequantizes(t);
    if (!packed && (!IsFloatingPoint(t.dtype) || DTypeBits(t.dtype) < 16)) continue;
    std::optional<DType> target;
    if (target_all) {
      target = KeptInFp32(t.name, keep_in_fp32) ? DType::kF32 : *target_all;
    } else if (auto m = model.find(t.name); m != model.end()) {
      LOADSTONE_ASSIGN_OR_RETURN(const DType param, FromScalarType(m->second.scalar_type()));
      if (IsFloatingPoint(param)) target = param;
    }
    if (!target || (!packed && *target == t.dtype)) continue;
    if (IsCastTarget(*target)) {
      rule.special.emplace(t.name, *target);
    } else if (packed) {  // decoded into f32, then cast by LibTorch
      rule.special.emplace(t.name, DType::kF32);
      LOADSTONE_ASSIGN_OR_RETURN(rule.after[t.name], ToScalarType(*target));
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(rule.after[t.name], ToScalarType(*target));
    }
  }
  return rule;
}

// The machine planned for and loaded on: the given Loader's, else the options', else this one.
std::shared_ptr<const Platform> PlatformOf(const TorchLoadOptions& options) {
  if (options.loader) return options.loader->platform();
  return options.platform ? options.platform : Platform::Default();
}

// A loaded tensor as an at::Tensor over the same memory, which it keeps alive.
Result<at::Tensor> Wrap(const loadstone::Tensor& t, bool simulated) {
  LOADSTONE_ASSIGN_OR_RETURN(const c10::ScalarType type, ToScalarType(t.dtype()));
  auto opts = at::TensorOptions().dtype(type);
  if (t.device() != "cpu" && !simulated) {
    LOADSTONE_ASSIGN_OR_RETURN(const Device d, ParseDevice(t.device()));
    opts = opts.device(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(d.index)));
  }
  return Guarded(fmt::format("tensor '{}' on {}", t.name(), t.device()), [&]() -> Result<at::Tensor> {
    return at::from_blob(t.mutable_data(), Sizes(t.shape()), [keep = t](void*) {}, opts);
  });
}

struct Loaded {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  Placement placement;
};

// Plans and loads `checkpoint` under `popt` (device map, dtypes and what to include already
// set), writes the disk tensors, and hands every loaded tensor over as an at::Tensor.
Result<Loaded> LoadPlanned(const Checkpoint& checkpoint, const PlanOptions& popt,
                           const TorchLoadOptions& options, const CastRule& rule,
                           const LoadOptions& load_options = {}) {
  const auto platform = PlatformOf(options);
  LOADSTONE_ASSIGN_OR_RETURN(const LoadPlan plan, Plan(checkpoint, popt));
  std::shared_ptr<Loader> loader = options.loader;
  if (!loader) loader = std::make_shared<Loader>(LoaderOptions{.platform = platform});
  LoadHandle load = loader->Load(checkpoint, plan, load_options);
  Loaded out;
  out.placement.device_map = plan.devices.device_map;
  out.placement.warnings = plan.warnings;
  if (!plan.offloaded.empty()) {
    LOADSTONE_RETURN_IF_ERROR(WriteOffload(*loader, checkpoint, plan).status());
    LOADSTONE_ASSIGN_OR_RETURN(out.placement.offloaded, OffloadStore::Open(loader, checkpoint, plan));
    for (const std::string& name : out.placement.offloaded->names()) {
      out.placement.device_of[name] = "disk";
    }
  }
  LOADSTONE_RETURN_IF_ERROR(load.Done().get());
  const bool simulated = platform->simulated();
  out.placement.simulated = simulated;
  std::unordered_map<std::string_view, std::string_view> renamed;  // decoded packed weights
  for (const TensorPlan& tp : plan.tensors) {
    const TensorInfo& src = checkpoint.tensors()[tp.source];
    if (Unpacks(tp.conversion)) renamed.emplace(src.name, src.decoded_name());
  }
  for (const loadstone::Tensor& t : load.Tensors()) {
    const auto name = renamed.find(t.name());
    const std::string key(name == renamed.end() ? std::string_view(t.name()) : name->second);
    LOADSTONE_ASSIGN_OR_RETURN(at::Tensor wrapped, Wrap(t, simulated));
    if (auto after = rule.after.find(t.name()); after != rule.after.end()) {
      LOADSTONE_ASSIGN_OR_RETURN(wrapped, Guarded(t.name(), [&]() -> Result<at::Tensor> {
                                   return wrapped.to(after->second);
                                 }));
    }
    out.placement.device_of[key] = t.device();
    out.tensors.emplace_back(key, std::move(wrapped));
  }
  return out;
}

// The device map and the planning options every load shares.
Result<PlanOptions> BasePlanOptions(const TorchLoadOptions& options) {
  PlanOptions popt;
  popt.platform = PlatformOf(options);
  popt.max_memory = options.max_memory;
  popt.offload_folder = options.offload_folder;
  popt.offload_buffers = options.offload_buffers;
  popt.pin_cpu_tensors = options.pin_memory;
  if (options.dtype) {
    LOADSTONE_ASSIGN_OR_RETURN(const DType d, FromScalarType(*options.dtype));  // checked here
    if (!IsCastTarget(d)) {
      return Status::Unsupported(fmt::format(
          "torch_dtype {}: loadstone loads into float32, float16 or bfloat16; load with one of "
          "those and cast the module after",
          TorchName(d)));
    }
    // Not popt.dtype: every cast is a special dtype of the one rule (CastTargets), and the map
    // is sized by those placed dtypes.
  }
  LOADSTONE_ASSIGN_OR_RETURN(const NormalizedDeviceMap map, NormalizeDeviceMap(options.device_map));
  if (map.map) {
    popt.explicit_map = *map.map;
  } else {
    popt.device_map = map.mode;
  }
  return popt;
}

Result<Checkpoint> OpenAt(const std::string& path, const TorchLoadOptions& options) {
  return Checkpoint::Open(path, options.open);
}

// The planning options of a load into `model`: the shared ones, the model's no-split modules
// (for a string device map), and the model's tree.
Result<PlanOptions> ModulePlanOptions(const torch::nn::Module& model,
                                      const TorchLoadOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(PlanOptions popt, BasePlanOptions(options));
  if (!popt.explicit_map) {
    LOADSTONE_ASSIGN_OR_RETURN(popt.no_split, NoSplitModules(model, popt.device_map));
  }
  LOADSTONE_ASSIGN_OR_RETURN(ModelDescription description, DescribeModule(model));
  popt.model = std::move(description.tree);
  return popt;
}

// The modules kept in float32: the options', then the model's own (ModelTraits).
std::vector<std::string> KeepInFp32(const torch::nn::Module& model,
                                    const TorchLoadOptions& options) {
  std::vector<std::string> keep = options.keep_in_fp32_modules;
  if (const auto* traits = dynamic_cast<const ModelTraits*>(&model)) {
    for (std::string& m : traits->keep_in_fp32_modules()) keep.push_back(std::move(m));
  }
  return keep;
}

// copy_into_parameters: the tensors whose parameters, in host memory, contiguous, of the dtype
// the tensor loads as, are the load's destination (nothing allocated, nothing copied after).
std::unordered_set<std::string> DirectFills(const Checkpoint& checkpoint, const Fills& fills,
                                            const CastRule& rule) {
  std::unordered_set<std::string> direct;
  for (const std::string& name : fills.include) {
    const TensorInfo& t = *checkpoint.Find(name);
    const at::Tensor& param = fills.param_of.at(name);
    auto special = rule.special.find(name);
    const DType loads_as = special != rule.special.end() ? special->second : t.dtype;
    auto param_dtype = FromScalarType(param.scalar_type());
    if (param.device().is_cpu() && param.is_contiguous() && !rule.after.contains(name) &&
        param_dtype.ok() && *param_dtype == loads_as) {
      direct.insert(name);
    }
  }
  return direct;
}

// Sets load_options.destination to the memory of the `direct` parameters. Pointers taken now,
// on this thread: the callback runs on the Loader's event loop and must neither call LibTorch
// nor throw.
void SetDestinations(const std::unordered_set<std::string>& direct, const Fills& fills,
                     LoadOptions& load_options) {
  std::unordered_map<std::string_view, std::span<std::byte>> memory;
  for (const std::string& name : direct) {
    const at::Tensor& param = fills.param_of.at(name);
    memory.emplace(name, std::span<std::byte>(static_cast<std::byte*>(param.data_ptr()), param.nbytes()));
  }
  load_options.destination = [memory = std::move(memory)](const TensorInfo& t, const TensorPlan&) {
    auto it = memory.find(t.name);
    return it == memory.end() ? std::span<std::byte>() : it->second;
  };
}

// Hands the loaded tensors to the model's tensors (`target`, by key): each takes its loaded
// tensor, or with copy_into_parameters is copied into (or was read into already); those on
// disk are left empty.
Status FillModel(Loaded& loaded, std::unordered_map<std::string, at::Tensor>& target,
                 const TorchLoadOptions& options) {
  return Guarded("filling the model", [&]() -> Status {
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : loaded.tensors) {
      auto it = target.find(name);
      if (it == target.end()) continue;  // loaded with another (a float8 weight's scales)
      at::Tensor& param = it->second;
      // Read straight into the parameter's own memory (planned on the CPU as caller memory).
      if (tensor.data_ptr() == param.data_ptr()) continue;
      if (options.copy_into_parameters) {
        param.copy_(tensor);
      } else {
        param.set_data(tensor);
      }
    }
    if (loaded.placement.offloaded) {
      for (const std::string& name : loaded.placement.offloaded->names()) {
        auto it = target.find(name);
        if (it != target.end()) it->second.set_data(at::empty({0}, it->second.options()));
      }
    }
    return Status::OK();
  });
}

}  // namespace

// ---- loading -------------------------------------------------------------------------------

at::Tensor StateDict::at(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return {};
}

Result<StateDict> LoadStateDict(const std::string& path, const TorchLoadOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(const Checkpoint checkpoint, OpenAt(path, options));
  LOADSTONE_ASSIGN_OR_RETURN(PlanOptions popt, BasePlanOptions(options));
  LOADSTONE_ASSIGN_OR_RETURN(const CastRule rule,
                             CastTargets(checkpoint, nullptr, options, options.keep_in_fp32_modules, {}));
  popt.special_dtypes = rule.special;
  LOADSTONE_ASSIGN_OR_RETURN(Loaded loaded, LoadPlanned(checkpoint, popt, options, rule));
  StateDict out;
  out.tensors = std::move(loaded.tensors);
  out.placement = std::move(loaded.placement);
  return out;
}

Result<LoadReport> LoadInto(torch::nn::Module& model, const std::string& path,
                            const TorchLoadOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(const Checkpoint checkpoint, OpenAt(path, options));
  LOADSTONE_ASSIGN_OR_RETURN(PlanOptions popt, ModulePlanOptions(model, options));
  // Keys: the model's state dict against the checkpoint's tensors (the one rule of state_dict.h).
  const auto state = PersistentStateDict(model);
  std::unordered_map<std::string, at::Tensor> target(state.begin(), state.end());
  const KeyMatch match = MatchStateDict(checkpoint, ModelKeys(state));
  LOADSTONE_ASSIGN_OR_RETURN(LoadReport report, ReportKeys(match, path, options));
  const Fills fills = FillsOf(checkpoint, match, target);
  LOADSTONE_RETURN_IF_ERROR(RefuseUnmatched(model, report, options));

  LOADSTONE_ASSIGN_OR_RETURN(
      const CastRule rule,
      CastTargets(checkpoint, &fills.include, options, KeepInFp32(model, options), fills.param_of));
  popt.special_dtypes = rule.special;
  popt.include = [&fills](const TensorInfo& t) { return fills.include.contains(t.name); };
  std::unordered_set<std::string> direct;
  LoadOptions load_options;
  if (options.copy_into_parameters) {
    direct = DirectFills(checkpoint, fills, rule);
    popt.caller_memory = [&direct](const TensorInfo& t) { return direct.contains(t.name); };
    SetDestinations(direct, fills, load_options);
  }
  LOADSTONE_ASSIGN_OR_RETURN(Loaded loaded,
                             LoadPlanned(checkpoint, popt, options, rule, load_options));
  LOADSTONE_RETURN_IF_ERROR(FillModel(loaded, target, options));
  report.placement = std::move(loaded.placement);
  return report;
}

Status MaterializeOffloaded(torch::nn::Module& model, const Placement& placement,
                            const Device& device) {
  if (!placement.offloaded) return Status::OK();
  const auto state = PersistentStateDict(model);
  std::unordered_map<std::string, at::Tensor> target(state.begin(), state.end());
  Result<LoadHandle> handle = placement.offloaded->Fetch(placement.offloaded->names(), device);
  LOADSTONE_RETURN_IF_ERROR(handle.status());
  LOADSTONE_RETURN_IF_ERROR(handle->Done().get());
  for (const loadstone::Tensor& t : handle->Tensors()) {
    auto it = target.find(t.name());
    if (it == target.end()) continue;
    // The store loads through the placement's Loader, whose platform decides what a GPU
    // address is: a simulated device's memory is host memory.
    LOADSTONE_ASSIGN_OR_RETURN(at::Tensor wrapped, Wrap(t, t.device() != "cpu" && placement.simulated));
    LOADSTONE_RETURN_IF_ERROR(Guarded(t.name(), [&]() -> Status {
      torch::NoGradGuard no_grad;
      it->second.set_data(wrapped);
      return Status::OK();
    }));
  }
  return Status::OK();
}

}  // namespace loadstone::libtorch
