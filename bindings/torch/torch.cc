// The load path of the LibTorch face (include/loadstone/torch.h): one casting rule, a plan and a
// load through loadstone's Loader, and the loaded tensors handed over as at::Tensors — here as a
// state dict; filled into a module, as each lands, in module_load.cc.
#include "loadstone/torch.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"  // beside this file: the binding sees loadstone's public headers only
#include "load_path.h"
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

}  // namespace

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

Renames RenamesOf(const Checkpoint& checkpoint, const LoadPlan& plan) {
  Renames renamed;
  for (const TensorPlan& tp : plan.tensors) {
    const TensorInfo& src = checkpoint.tensors()[tp.source];
    if (Unpacks(tp.conversion)) renamed.emplace(src.name, src.decoded_name());
  }
  return renamed;
}

Result<std::pair<std::string, at::Tensor>> HandOver(const loadstone::Tensor& t,
                                                     const Renames& renamed, const CastRule& rule,
                                                     bool simulated) {
  const auto name = renamed.find(t.name());
  std::string key(name == renamed.end() ? std::string_view(t.name()) : name->second);
  LOADSTONE_ASSIGN_OR_RETURN(at::Tensor wrapped, Wrap(t, simulated));
  if (auto after = rule.after.find(t.name()); after != rule.after.end()) {
    LOADSTONE_ASSIGN_OR_RETURN(wrapped, Guarded(t.name(), [&]() -> Result<at::Tensor> {
                                 return wrapped.to(after->second);
                               }));
  }
  return std::pair{std::move(key), std::move(wrapped)};
}

Status AttachOffload(const std::shared_ptr<Loader>& loader, const Checkpoint& checkpoint,
                     const LoadPlan& plan, Placement* placement) {
  placement->device_map = plan.devices.device_map;
  placement->warnings = plan.warnings;
  placement->simulated = loader->platform()->simulated();
  if (plan.offloaded.empty()) return Status::OK();
  LOADSTONE_RETURN_IF_ERROR(WriteOffload(*loader, checkpoint, plan).status());
  LOADSTONE_ASSIGN_OR_RETURN(placement->offloaded, OffloadStore::Open(loader, checkpoint, plan));
  for (const std::string& name : placement->offloaded->names()) {
    placement->device_of[name] = "disk";
  }
  return Status::OK();
}

std::shared_ptr<Loader> LoaderOf(const TorchLoadOptions& options) {
  if (options.loader) return options.loader;
  return std::make_shared<Loader>(LoaderOptions{.platform = PlatformOf(options)});
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
  LOADSTONE_ASSIGN_OR_RETURN(const LoadPlan plan, Plan(checkpoint, popt));
  const std::shared_ptr<Loader> loader = LoaderOf(options);
  LoadHandle load = loader->Load(checkpoint, plan);
  StateDict out;
  LOADSTONE_RETURN_IF_ERROR(AttachOffload(loader, checkpoint, plan, &out.placement));
  LOADSTONE_RETURN_IF_ERROR(load.Done().get());
  const Renames renamed = RenamesOf(checkpoint, plan);
  for (const loadstone::Tensor& t : load.Tensors()) {
    LOADSTONE_ASSIGN_OR_RETURN(auto handed,
                               HandOver(t, renamed, rule, out.placement.simulated));
    out.placement.device_of[handed.first] = t.device();
    out.tensors.push_back(std::move(handed));
  }
  return out;
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
