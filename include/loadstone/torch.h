// The LibTorch face (library loadstone_torch, CMake target loadstone::torch): checkpoints as
// at::Tensors and into torch::nn::Modules, the way diffusers' from_pretrained loads them — one
// path for whole, sharded, safetensors and .bin checkpoints, each tensor cast by one rule and
// placed by the device map (a GPU, "cpu", or "disk" in an offload folder).
//
//   struct UNetImpl : torch::nn::Module, loadstone::libtorch::ModelTraits {
//     std::optional<std::vector<std::string>> no_split_modules() const override {
//       return std::vector<std::string>{"BasicTransformerBlock", "ResnetBlock2D"};
//     }
//     ...
//   };
//   UNet unet;
//   loadstone::libtorch::TorchLoadOptions opt;
//   opt.device_map = loadstone::libtorch::DeviceMapArg::Name("auto");
//   opt.max_memory = loadstone::MaxMemory{{"0", "2GiB"}, {"cpu", "16GiB"}};
//   opt.dtype = at::kHalf;
//   auto report = loadstone::libtorch::LoadInto(*unet, "models/sd/unet", opt);
//   if (!report.ok()) { std::cerr << report.status() << "\n"; return 1; }
//   std::cout << report->device_map.ToJson() << "\n";   // hf_device_map
//
// Tensors are zero-copy: an at::Tensor's deleter keeps loadstone's buffer alive. GPU tensors
// are CUDA at::Tensors (a LibTorch built with CUDA is needed for them); on a simulated platform
// (runtime/sim, for tests) device memory is host memory, so those at::Tensors are CPU tensors
// and `placement` says which simulated device holds them.
#ifndef LOADSTONE_TORCH_H_
#define LOADSTONE_TORCH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <torch/torch.h>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/loader.h"
#include "loadstone/offload.h"
#include "loadstone/platform.h"
#include "loadstone/status.h"

namespace loadstone::libtorch {

// ---- dtypes --------------------------------------------------------------------------------

// loadstone ↔ LibTorch element types. Errors: Unsupported for a type the other side lacks:
// uint16/32/64, float8, float4/6 (LibTorch 1.13, the Debian one this is built against, has
// none of them; newer LibTorch's float8 types are not mapped yet).
Result<c10::ScalarType> ToScalarType(DType dtype);
Result<DType> FromScalarType(c10::ScalarType type);

// ---- what a model says about itself ----------------------------------------------------------

// diffusers' ModelMixin attributes, for a torch::nn::Module that also derives from this (the
// root model, and sub-models that are models of their own).
class ModelTraits {
 public:
  virtual ~ModelTraits() = default;
  // `_no_split_modules`: the classes (Module::name() without namespace and "Impl") never split
  // across devices. nullopt: the model declares none, and a string device map is refused.
  virtual std::optional<std::vector<std::string>> no_split_modules() const { return std::nullopt; }
  // `_keep_in_fp32_modules`: name components whose tensors stay float32 under a target dtype.
  virtual std::vector<std::string> keep_in_fp32_modules() const { return {}; }
  // Buffers registered with persistent=False (LibTorch has no such flag): dotted names relative
  // to this module. They are not in the state dict: never loaded, never missing.
  virtual std::vector<std::string> non_persistent_buffers() const { return {}; }
};

// The model description (docs/model-json.md) of `module`: class names, parameters and
// buffers with shapes, dtypes and persistence, parameters tied by shared storage (the first in
// registration order is the source). No planning fields are set.
// Errors: Unsupported (a dtype loadstone does not know).
Result<std::string> DescribeModuleJson(const torch::nn::Module& module);
Result<ModelDescription> DescribeModule(const torch::nn::Module& module);

// diffusers' _get_no_split_modules: the union of the no-split classes of every model met going
// down from the root (a model's declared classes are not entered). Errors: InvalidArgument
// "X does not support `device_map='auto'`. To implement support, the model class needs to
// implement the `_no_split_modules` attribute." for a model that declares none (`mode` is the
// string asked for).
Result<std::vector<std::string>> NoSplitModules(const torch::nn::Module& module,
                                                std::string_view mode = "auto");

// ---- device maps, as diffusers takes them ----------------------------------------------------

// from_pretrained's device_map argument: nothing, an integer, a string, a device or a dict.
struct DeviceMapArg {
  std::variant<std::monostate, int64_t, std::string, c10::Device, DeviceMap> value;

  static DeviceMapArg Index(int64_t ordinal) { return {ordinal}; }
  static DeviceMapArg Name(std::string name) { return {std::move(name)}; }
  static DeviceMapArg TorchDevice(c10::Device device) { return {device}; }
  static DeviceMapArg Map(DeviceMap map) { return {std::move(map)}; }
};

// The argument normalised as diffusers does: a string mode ("auto", "balanced",
// "balanced_low_0", "sequential") stays one; a device string, a device or a non-negative integer
// becomes {"": device}; a dict is used as given. Nothing: {"": cpu}.
struct NormalizedDeviceMap {
  std::string mode;               // set for a string mode
  std::optional<DeviceMap> map;   // set otherwise
};
// Errors (diffusers' messages): InvalidArgument "You can't pass device_map as a negative int. If
// you want to put the model on the cpu, pass device_map = 'cpu' " for -1; "When passing
// device_map as a string, the value needs to be a device name (e.g. cpu, cuda:0) or 'auto',
// 'balanced', 'balanced_low_0', 'sequential' but found X." for a string torch.device refuses.
Result<NormalizedDeviceMap> NormalizeDeviceMap(const DeviceMapArg& arg);

// ---- loading -------------------------------------------------------------------------------

struct TorchLoadOptions {
  OpenOptions open;                      // variant, subfolder
  // torch_dtype: floating tensors are cast to it (keep_in_fp32 ones to float32). Unset: each
  // tensor to its parameter's dtype (LoadInto), or as stored (LoadStateDict).
  std::optional<c10::ScalarType> dtype;
  // Added to the model's ModelTraits::keep_in_fp32_modules. diffusers' rule: a tensor is kept
  // when one component of its dotted name equals one of them.
  std::vector<std::string> keep_in_fp32_modules;
  DeviceMapArg device_map;               // nothing: everything in host memory
  std::optional<MaxMemory> max_memory;
  std::string offload_folder;            // for disk tensors that cannot be read in place
  bool offload_buffers = false;
  // `cpu` tensors in pinned host memory of the GPU (PlanOptions::pin_cpu_tensors): an error
  // without one, or when the driver will not pin. With copy_into_parameters, parameters whose
  // own memory is filled are not affected (their memory is the model's).
  bool pin_memory = false;
  // LoadInto: missing or unexpected keys are an error (after the report is complete).
  bool strict = false;
  // LoadInto: a shape mismatch is reported and the parameter left as it is, not an error.
  bool ignore_mismatched_sizes = false;
  // LoadInto: fill the parameters' existing memory instead of handing them loadstone's buffers;
  // for models whose parameters are already where they should be (a hot-swapped checkpoint).
  // Parameters in host memory, contiguous and of the dtype their tensor loads as are the load's
  // own destination (PlanOptions::caller_memory: read straight into, no memory allocated);
  // others (on a GPU, another dtype) are loaded, then copied with param.copy_.
  bool copy_into_parameters = false;
  // The machine to plan for and load on; unset: Platform::Default().
  std::shared_ptr<const Platform> platform;
  // The Loader to use (reuse one across loads); unset: one made on `platform` for this load.
  std::shared_ptr<Loader> loader;
};

// A key whose shape differs between the model and the checkpoint.
struct MismatchedKey {
  std::string name;
  std::vector<int64_t> expected;  // the model's
  std::vector<int64_t> found;     // the checkpoint's
};

// What a load placed where: the map used (diffusers' hf_device_map, keys in accelerate's
// order), each loaded key's device ("cuda:0", "cpu", "disk"), the disk tensors.
struct Placement {
  DeviceMap device_map;
  std::map<std::string, std::string> device_of;
  std::shared_ptr<OffloadStore> offloaded;  // null when nothing went to disk
  std::vector<std::string> warnings;
  bool simulated = false;  // loaded on a simulated platform: GPU tensors are host memory
};

struct StateDict {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // load order; disk tensors absent
  Placement placement;
  // The tensor `name`, or an undefined tensor.
  at::Tensor at(std::string_view name) const;
};

// Loads every tensor of the checkpoint at `path` (a file, an index or a model folder) onto the
// planned devices. A string device map plans over the checkpoint's names (no classes: no-split
// is loadstone's default, numbered blocks). Errors: those of Open, Plan and the load;
// Unsupported for a dtype LibTorch lacks.
Result<StateDict> LoadStateDict(const std::string& path, const TorchLoadOptions& options = {});

// diffusers' _load_pretrained_model for `model`: the report of what did not match.
struct LoadReport {
  std::vector<std::string> missing_keys;     // in the model, not in the checkpoint
  std::vector<std::string> unexpected_keys;  // in the checkpoint, not in the model
  std::vector<MismatchedKey> mismatched_keys;  // left as they were (ignore_mismatched_sizes)
  Placement placement;
};

// Fills `model`'s parameters and persistent buffers from the checkpoint at `path`, in place
// (the disk tensors' offload folder is written before the other tensors are handed over; a
// load that fails after it leaves the folder written):
// each takes loadstone's buffer on its planned device (or, with copy_into_parameters, is copied
// into), cast by the one rule of TorchLoadOptions::dtype. A string device map needs the model's
// _no_split_modules (NoSplitModules). Tensors mapped to disk are not loaded: their parameters
// become empty (numel 0) tensors, and Placement::offloaded materialises them on demand.
// Errors: InvalidArgument "Cannot load <path> because <key> expected shape <model shape>, but
// got <checkpoint shape>. ..." (a shape mismatch, unless ignored), "Missing key(s) in state
// dict: ..." / "Unexpected key(s) in state dict: ..." (strict), those of planning and loading.
// On an error the model may hold some new values but never a half-written tensor, except with
// copy_into_parameters, whose direct tensors are read straight into the parameters.
Result<LoadReport> LoadInto(torch::nn::Module& model, const std::string& path,
                            const TorchLoadOptions& options = {});

// A load into a module that goes on while the caller computes (StartLoadInto): each parameter
// and persistent buffer is filled as its tensor lands, in the plan's execution order
// (PlanOptions::order: embeddings, layers 0 … N-1, the norm, the head), so a submodule may run
// once Module(its prefix) resolves while the rest streams:
//
//   auto load = loadstone::libtorch::StartLoadInto(*model, path);
//   x = model->embed(ids);  // after (*load)->Module("model.embed_tokens").get()
//   for (k ...) { (*load)->Module(fmt::format("model.layers.{}", k)).get(); x = layer[k](x); }
//   auto report = (*load)->Finish();
//
// Destroying it before Finish cancels the load and waits for it (the model may then hold some
// new values, never a half-written tensor but with copy_into_parameters).
class ModuleLoad {
 public:
  ~ModuleLoad();
  ModuleLoad(const ModuleLoad&) = delete;
  ModuleLoad& operator=(const ModuleLoad&) = delete;

  // Resolves with OK once every parameter and buffer of submodule `prefix` ("model.layers.3";
  // "" every one) holds its checkpoint's values, or with the load's failure (the first fill's
  // when one failed). A prefix no tensor of the load is under: NotFound at once.
  std::shared_future<Status> Module(std::string_view prefix) const;
  // The load: Prioritize, OnModules, progress, Cancel.
  LoadHandle& handle();
  // Its plan; plan().modules is the order the modules come in.
  const LoadPlan& plan() const;
  // Waits for the rest and returns LoadInto's report. Errors: those of LoadInto; InvalidArgument
  // when called twice.
  Result<LoadReport> Finish();

  struct Impl;

 private:
  friend Result<std::unique_ptr<ModuleLoad>> StartLoadInto(torch::nn::Module&,
                                                          const std::string&,
                                                          const TorchLoadOptions&);
  explicit ModuleLoad(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// LoadInto's load, started: returns once it runs (the disk tensors written, their parameters
// emptied). Errors: those LoadInto meets before loading (keys, planning).
Result<std::unique_ptr<ModuleLoad>> StartLoadInto(torch::nn::Module& model,
                                                  const std::string& path,
                                                  const TorchLoadOptions& options = {});

// Materialises every offloaded parameter and buffer of `model` on `device` (what accelerate's
// hooks do before a forward pass), from `placement`. Errors: those of the loads.
Status MaterializeOffloaded(torch::nn::Module& model, const Placement& placement,
                            const Device& device);

// ---- saving (the tests' save_pretrained) -------------------------------------------------------

struct SaveOptions {
  std::string variant;                       // model.fp16.safetensors
  uint64_t max_shard_size = 10'000'000'000;  // diffusers' default "10GB"
  std::string prefix = "diffusion_pytorch_model";
  // false: a torch.save-compatible .bin (torch::pickle_save), as save_pretrained(safe_serialization=False).
  bool safe_serialization = true;
};

// Writes `model`'s state dict (parameters and persistent buffers, host copies) into `folder`
// as save_pretrained does: one file, or shards and their index. Returns the files written.
Result<std::vector<std::string>> SavePretrained(const torch::nn::Module& model,
                                                const std::string& folder,
                                                const SaveOptions& options = {});

// The state-dict entries of `model`: parameters, then persistent buffers, in registration order.
std::vector<std::pair<std::string, at::Tensor>> PersistentStateDict(const torch::nn::Module& model);

}  // namespace loadstone::libtorch

#endif  // LOADSTONE_TORCH_H_
