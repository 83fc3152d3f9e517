// Device maps: which device each part of a model goes to, planned as Hugging Face accelerate
// plans them (`device_map="auto"`, "balanced", "balanced_low_0", "sequential").
//
//   auto ckpt = loadstone::Checkpoint::Open("models/llama");
//   loadstone::DeviceMapOptions opt;
//   opt.max_memory = loadstone::MaxMemory{{"0", "20GiB"}, {"cpu", "64GiB"}};
//   opt.dtype = loadstone::DType::kBF16;
//   auto plan = loadstone::InferDeviceMap(*ckpt, opt);
//   if (!plan.ok()) { std::cerr << plan.status() << "\n"; return 1; }
//   std::cout << plan->device_map.ToJson() << "\n";   // {"model.embed_tokens": 0, ...}
//
// For the same module tree, sizes, budgets and no-split set, the map is the one accelerate's
// get_balanced_memory + infer_auto_device_map return: same keys, same order, same devices
// (docs/device-map.md, which also lists where loadstone can do better, behind flags).
//
// Everything here is pure data: planning reads no tensor bytes and touches no device. The only
// environment read is the default budgets when max_memory is not given: the free memory of the
// GPUs and the host of `DeviceMapOptions::platform` (this machine unless told otherwise).
//
// Thread safety: the functions are safe to call concurrently; ModuleTree, DeviceMap and the
// results are values (ModuleTree copies share immutable state).
#ifndef LOADSTONE_DEVICE_MAP_H_
#define LOADSTONE_DEVICE_MAP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/devices.h"
#include "loadstone/dtype.h"
#include "loadstone/model.h"
#include "loadstone/platform.h"
#include "loadstone/status.h"

namespace loadstone {

// ---- options -------------------------------------------------------------------------------

enum class PlanStrategy {
  kGreedy,  // accelerate's infer_auto_device_map (exact)
  kMinMax,  // contiguous partition of the layer sequence minimising the largest GPU load
};

// The defects of the reference planner (docs/device-map.md), each fixed when its flag is set.
// All off = accelerate's behaviour.
struct ReferenceFixes {
  // Tied parameters: "is inside module m" becomes a dotted-prefix test (the reference's substring
  // test takes module "1" to contain "11.weight").
  bool prefix_tie_test = false;
  // A split module's direct buffers are queued with its parameters and children (the reference
  // drops them, leaving them covered by no key of the map).
  bool requeue_split_buffers = false;
  // With offload_buffers off, buffers of disk-mapped modules are loaded on the main device like
  // those of cpu-mapped modules (the reference does not load them at all).
  bool load_disk_buffers = false;

  static ReferenceFixes All() { return ReferenceFixes{true, true, true}; }
};

struct DeviceMapOptions {
  // "auto" (= "balanced"), "balanced", "balanced_low_0", "sequential"; or one device for the
  // whole model: "cpu", "cuda", "cuda:1", "mps" or an integer string ("1").
  std::string device_map = "auto";
  // Budgets; unset: every GPU's free memory and the available host memory for cpu, on
  // `platform`.
  std::optional<MaxMemory> max_memory;
  // The machine planned for (its GPUs, its memory); unset: Platform::Default(), this machine.
  std::shared_ptr<const Platform> platform;
  // Target floating dtype; unset: tensors keep their dtype. Integer and bool tensors never change.
  std::optional<DType> dtype;
  // Modules never split across devices: class names ("LlamaDecoderLayer") or dotted name globs
  // ("model.layers.*"; '*' and '?' stay within one component). An entry containing '.', '*', '?'
  // or '[' is a glob; other entries match class names, and module names in trees without classes.
  // Unset: loadstone's default, repeated numbered blocks (`…layers.N`, `…h.N`, `…blocks.N`).
  // Empty: nothing is kept whole.
  std::optional<std::vector<std::string>> no_split;
  // Tensor name components kept in float32 when `dtype` is a reduced float type: a tensor matches
  // key K when K occurs in its name as whole dotted components (`(^|\.)K($|\.)`). Their planned
  // size is the float32 size.
  std::vector<std::string> keep_in_fp32;
  // Per-tensor dtypes (full tensor names), as accelerate's special_dtypes.
  std::map<std::string, DType> special_dtypes;
  bool offload_buffers = false;
  bool fallback_allocation = false;
  PlanStrategy strategy = PlanStrategy::kGreedy;
  ReferenceFixes fixes;
  // Merge keys whose sub-keys share one device (accelerate's clean_result).
  bool clean_result = true;
  // Record the step-by-step reasons in DevicePlan::explanation.
  bool explain = false;
};

// A model description (docs/model-json.md): the tree and the planning fields of the file.
struct ModelDescription {
  ModuleTree tree;
  DeviceMapOptions options;  // defaults where the file says nothing
};

// Errors: Corruption (invalid JSON, a key twice), InvalidArgument (a missing or ill-typed field,
// an unknown dtype, a tied name that cannot be resolved), IOError/NotFound (ReadModelDescription).
Result<ModelDescription> ParseModelDescription(std::string_view json_text);
Result<ModelDescription> ReadModelDescription(const std::string& path);

// ---- planning ------------------------------------------------------------------------------

struct DeviceUsage {
  Device device;
  uint64_t bytes = 0;             // planned tensor bytes there (fractional sizes rounded up)
  std::optional<uint64_t> budget;  // the budget the planner used (after balancing), if any
};

// Where a buffer is actually loaded when that differs from what the map says (offload_buffers
// off: buffers of offloaded modules go to the main device). nullopt device: not loaded at all
// (the reference's behaviour for disk-mapped buffers; see ReferenceFixes::load_disk_buffers).
struct BufferPlacement {
  std::string name;
  std::optional<Device> device;
};

struct DevicePlan {
  DeviceMap device_map;
  // Every device with a budget or with bytes, in device order.
  std::vector<DeviceUsage> usage;
  std::vector<BufferPlacement> buffers;
  // The no-split entries used, and whether they are loadstone's default (numbered blocks).
  std::vector<std::string> no_split;
  bool default_no_split = false;
  // Warnings (the offload_buffers warning, devices that got nothing, tensors no key covers, ...).
  std::vector<std::string> warnings;
  // The step-by-step reasons, when options.explain.
  std::vector<std::string> explanation;
};

// Plans `tree` under `options`.
// Errors: InvalidArgument (a bad device_map string or negative device ordinal, a bad max_memory
// key or value, "balanced_low_0" with GPUs not numbered 0..N-1), IOError (default budgets).
Result<DevicePlan> InferDeviceMap(const ModuleTree& tree, const DeviceMapOptions& options);
Result<DevicePlan> InferDeviceMap(const Checkpoint& checkpoint, const DeviceMapOptions& options);

// Checks a user-given map against the model (accelerate's check_device_map): every state-dict
// tensor must be covered by a key equal to it or a dotted prefix of it ("" covers all).
// Keys that name no module are reported in `*warnings` (may be null).
// Errors: InvalidArgument "The device_map provided does not give any device for the following
// parameters: a, b".
Status CheckDeviceMap(const ModuleTree& tree, const DeviceMap& map,
                      std::vector<std::string>* warnings = nullptr);

// A map with a disk entry needs an offload folder unless every tensor can be read in place from
// its safetensors source (transformers' rule). Errors: InvalidArgument naming offload_folder.
Status CheckDiskOffload(const DeviceMap& map, std::string_view offload_folder,
                        bool source_is_safetensors);

}  // namespace loadstone

#endif  // LOADSTONE_DEVICE_MAP_H_
