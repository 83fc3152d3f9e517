// Devices and device maps: where tensors go ("cuda:0", "cpu", "disk"), the ordered map from module
// prefixes to devices that accelerate calls `hf_device_map`, the memory budgets (max_memory), and
// the map planned as Hugging Face accelerate plans it (`device_map="auto"`, "balanced",
// "balanced_low_0", "sequential").
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

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/model.h"
#include "loadstone/platform.h"
#include "loadstone/status.h"

namespace loadstone {

// ---- devices, maps and budgets (pure values) ------------------------------------------------


// A place for tensors. Devices order as accelerate orders them: GPUs by ordinal, mps, cpu, disk.
struct Device {
  enum class Type : uint8_t { kCuda, kMps, kCpu, kDisk };
  Type type = Type::kCpu;
  int index = 0;  // the GPU ordinal for kCuda; 0 otherwise

  static Device Cuda(int index) { return Device{Type::kCuda, index}; }
  static Device Mps() { return Device{Type::kMps, 0}; }
  static Device Cpu() { return Device{Type::kCpu, 0}; }
  static Device Disk() { return Device{Type::kDisk, 0}; }

  bool is_gpu() const { return type == Type::kCuda; }
  // "cuda:0", "mps", "cpu", "disk".
  std::string ToString() const;
  // accelerate's spelling as a JSON value and as a max_memory key: 0, "mps", "cpu", "disk"
  // (ToJsonValue) and "0", "mps", "cpu", "disk" (ToKey).
  std::string ToJsonValue() const;
  std::string ToKey() const;

  friend bool operator==(const Device&, const Device&) = default;
  friend auto operator<=>(const Device&, const Device&) = default;
};

// Parses "cuda:N", "cuda" (= cuda:0), "N" (= cuda:N), "mps", "cpu" and "disk".
// Errors: InvalidArgument (anything else, a negative or huge ordinal).
Result<Device> ParseDevice(std::string_view text);

// An ordered map from module (or tensor) name prefixes to devices, as accelerate's
// `hf_device_map`. The key "" covers the whole model.
class DeviceMap {
 public:
  struct Entry {
    std::string prefix;
    Device device;
    friend bool operator==(const Entry&, const Entry&) = default;
  };

  DeviceMap() = default;

  // Appends an entry. Errors: InvalidArgument when `prefix` is already a key.
  Status Add(std::string prefix, Device device);

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // The device stored under exactly `prefix`, or nullptr.
  const Device* Find(std::string_view prefix) const;

  // The device of a tensor: the entry with the longest dotted prefix of `tensor_name` (the name
  // itself, then "a.b" for "a.b.c", ..., then ""). nullopt when no entry covers the name.
  // Probes only the prefixes as long as some key, so a deep name costs little.
  std::optional<Device> Lookup(std::string_view tensor_name) const;

  // `{"model.embed_tokens": 0, "lm_head": "cpu"}`: entry order, GPUs as integers, the spacing of
  // Python's json.dumps (so the text equals json.dumps(model.hf_device_map)).
  std::string ToJson() const;

  // Parses a JSON object of the ToJson form; values may also be device strings ("cuda:1").
  // A document with a "device_map" object member (what `loadstone plan --json` prints) gives
  // that member. Keeps the key order. Errors: InvalidArgument (not an object, a bad device, a
  // key twice, a number beyond double's range, nesting deeper than 256).
  static Result<DeviceMap> FromJson(std::string_view json);

  friend bool operator==(const DeviceMap& a, const DeviceMap& b) { return a.entries_ == b.entries_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index_;
  std::vector<size_t> key_lengths_;  // the keys' distinct lengths, longest first
};

// accelerate's convert_file_size_to_int for a string: "10GiB" = 10·2^30, "10GB" = 10^10, "5MB" =
// 5·10^6, "5Mb" = 625,000 (a lowercase final b means bits, decimal units only). The number is
// parsed as Python's float() parses it, multiplied, truncated.
// Errors: InvalidArgument with accelerate's message ("`size` X is not in a valid format. ...")
// for no or an unknown unit ("100", "5TB", "5B"), a bad number, a negative result.
Result<uint64_t> ParseSizeString(std::string_view text);

// One max_memory value as accelerate accepts it: an integer (bytes, used as is), a float (bytes,
// used as is) or a size string (ParseSizeString).
using SizeValue = std::variant<int64_t, double, std::string>;

// Budget per device. Keys: "0", "1", ... or "cuda:0", ... for GPUs, "mps", "cpu", "disk".
using MaxMemory = std::map<std::string, SizeValue>;


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
