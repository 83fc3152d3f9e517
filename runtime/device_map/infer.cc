// InferDeviceMap: options → sizes → budgets → placement → clean map → report.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/device/platform_impl.h"
#include "runtime/device_map/budgets.h"
#include "runtime/device_map/clean.h"
#include "runtime/device_map/greedy.h"
#include "runtime/device_map/min_max.h"
#include "runtime/device_map/modes.h"
#include "runtime/device_map/infer.h"

namespace loadstone {
namespace device_map {
namespace {

uint64_t FloorBytes(PyNum n) {
  double v = n.AsDouble();
  if (!(v > 0)) return 0;
  if (v >= 1.8e19) return UINT64_MAX;
  return n.is_float() ? static_cast<uint64_t>(std::floor(v)) : static_cast<uint64_t>(n.Trunc());
}

// The offload_buffers warning of infer_auto_device_map.
void BufferWarning(const Placement& placement, const Budgets& budgets,
                   std::vector<std::string>* warnings) {
  PyNum off_gpu;
  for (const auto& [device, bytes] : placement.buffer_bytes) {
    if (device == Device::Cpu() || device == Device::Disk()) off_gpu += bytes;
  }
  if (!(off_gpu > PyNum())) return;
  bool has_gpu = false;
  bool fits = false;
  for (const Budget& b : budgets) {
    if (b.device == Device::Cpu() || b.device == Device::Disk()) continue;
    has_gpu = true;
    PyNum used;
    for (const auto& [device, bytes] : placement.used) {
      if (device == b.device && bytes > PyNum()) used = bytes;
    }
    if (!fits && b.bytes >= off_gpu + used) fits = true;
  }
  if (has_gpu && !fits) {
    warnings->push_back(fmt::format(
        "Current model requires {} bytes of buffer for offloaded layers, which seems does not fit "
        "any GPU's remaining memory. If you are experiencing a OOM later, please consider using "
        "offload_buffers=True.",
        off_gpu.Repr()));
  }
}

void MinimumWarning(const Placement& placement, std::vector<std::string>* warnings) {
  if (placement.min_required.empty()) return;
  std::string text =
      "Based on the current allocation process, no modules could be assigned to the following "
      "devices due to insufficient memory:";
  for (const auto& [device, bytes] : placement.min_required) {
    text += fmt::format("\n  - {}: {} bytes required", device.ToKey(), bytes.Repr());
  }
  text +=
      "\nThese minimum requirements are specific to this allocation attempt and may vary. "
      "Consider increasing the available memory for these devices to at least the specified "
      "minimum, or adjusting the model config.";
  warnings->push_back(std::move(text));
}

// Bytes per device from the final map; tensors no key covers are reported.
void Report(const ModuleTree::Impl& tree, const ModuleSizes& sizes, const Budgets& budgets,
            DevicePlan* plan) {
  std::vector<std::pair<Device, uint64_t>> eighths;
  auto add = [&](Device d, uint64_t v) {
    for (auto& [device, total] : eighths) {
      if (device == d) {
        total += v;
        return;
      }
    }
    eighths.push_back({d, v});
  };
  for (const Budget& b : budgets) add(b.device, 0);
  // Device per module, top-down: its own key, else its parent's (one probe per name).
  const DeviceMap& map = plan->device_map;
  std::vector<std::optional<Device>> node_device(tree.nodes.size());
  for (int32_t id : tree.nodes_by_pre) {
    const TreeNode& node = tree.nodes[static_cast<size_t>(id)];
    if (const Device* d = map.Find(node.name)) {
      node_device[static_cast<size_t>(id)] = *d;
    } else if (node.parent >= 0) {
      node_device[static_cast<size_t>(id)] = node_device[static_cast<size_t>(node.parent)];
    }
  }
  std::vector<std::string> uncovered;
  for (int32_t t : tree.SizedTensors()) {
    const TreeTensor& tensor = tree.tensors[static_cast<size_t>(t)];
    const Device* own = map.Find(tensor.name);
    std::optional<Device> device = own ? std::optional<Device>(*own)
                                       : node_device[static_cast<size_t>(tensor.node)];
    if (!device) {
      uncovered.emplace_back(tensor.name);
      continue;
    }
    double v = sizes.tensor[static_cast<size_t>(t)].AsDouble() * 8.0;
    add(*device, v > 0 ? static_cast<uint64_t>(std::llround(v)) : 0);
  }
  std::sort(eighths.begin(), eighths.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [device, total] : eighths) {
    DeviceUsage usage{device, (total + 7) / 8, std::nullopt};
    const Budget* b = FindBudget(budgets, device);
    if (b && device != Device::Disk()) usage.budget = FloorBytes(b->bytes);  // disk is unlimited
    plan->usage.push_back(usage);
  }
  if (!uncovered.empty()) {
    std::vector<std::string> shown(uncovered.begin(),
                                   uncovered.begin() + static_cast<ptrdiff_t>(std::min<size_t>(5, uncovered.size())));
    plan->warnings.push_back(fmt::format(
        "{} tensor(s) are covered by no key of the device map (accelerate drops the direct buffers "
        "of a split module; ReferenceFixes::requeue_split_buffers queues them): {}{}",
        uncovered.size(), fmt::join(shown, ", "), uncovered.size() > shown.size() ? ", ..." : ""));
  }
}

// With offload_buffers off, buffers of offloaded modules live on the main device.
void PlaceBuffers(const ModuleTree::Impl& tree, const DeviceMapOptions& options,
                  const Budgets& budgets, DevicePlan* plan) {
  if (options.offload_buffers) return;
  Device main = Device::Cpu();
  for (const Budget& b : budgets) {
    if (b.device.is_gpu() || b.device == Device::Mps()) {
      main = b.device;
      break;
    }
  }
  for (const DeviceUsage& u : plan->usage) {
    if (main == Device::Cpu() && (u.device.is_gpu() || u.device == Device::Mps())) main = u.device;
  }
  for (const TreeTensor& t : tree.tensors) {
    if (!t.is_buffer) continue;
    std::optional<Device> device = plan->device_map.Lookup(t.name);
    if (!device) continue;
    if (*device == Device::Cpu() && main != Device::Cpu()) {
      plan->buffers.push_back({std::string(t.name), main});
    } else if (*device == Device::Disk()) {
      plan->buffers.push_back(
          {std::string(t.name), options.fixes.load_disk_buffers ? std::optional<Device>(main) : std::nullopt});
    }
  }
}

// No-split entries that match no module: a class name on a tree that has none cannot be meant
// (an accelerate habit on a bare checkpoint) and is an error; others are warned about.
Status CheckNoSplit(const ModuleTree::Impl& tree, const NoSplit& no_split,
                    std::vector<std::string>* warnings) {
  std::vector<bool> matched(no_split.entries().size(), false);
  for (size_t n = 0; n < tree.nodes.size(); ++n) {
    for (size_t i = 0; i < matched.size(); ++i) {
      if (!matched[i] && no_split.EntryMatches(i, static_cast<int32_t>(n))) matched[i] = true;
    }
  }
  for (size_t i = 0; i < matched.size(); ++i) {
    if (matched[i]) continue;
    const std::string& entry = no_split.entries()[i];
    if (!tree.has_classes && !IsNameGlob(entry)) {
      return Status::InvalidArgument(fmt::format(
          "no-split entry '{}' matches no module: a checkpoint's module tree comes from its "
          "tensor names and has no class names; keep blocks whole with a name glob such as "
          "'model.layers.*' (what loadstone keeps whole by default), or describe the model "
          "with classes (--model-json)",
          entry));
    }
    warnings->push_back(fmt::format(
        "no-split entry '{}' matches no module, so it keeps nothing whole{}", entry,
        IsNameGlob(entry) ? "" : " (no module has that class name)"));
  }
  return Status::OK();
}

void CheckSpecialDTypes(const ModuleTree::Impl& tree, const DeviceMapOptions& options,
                        std::vector<std::string>* warnings) {
  for (const auto& [name, dtype] : options.special_dtypes) {
    if (tree.FindTensor(name) < 0) {
      warnings->push_back(fmt::format(
          "special dtype for '{}' names no tensor of the model; it changes nothing", name));
    }
  }
}

}  // namespace

namespace {

// The map of a mode (auto, balanced, ...): accelerate's placement (or min-max) over `budgets`,
// cleaned unless asked not to, with its explanation and warnings.
Status PlaceModules(const ModuleTree::Impl& impl, const DeviceMapOptions& options,
                    const ModuleSizes& sizes, const NoSplit& no_split, const SizePolicy& policy,
                    const Budgets& budgets, DevicePlan* plan) {
  PlanContext ctx;
  ctx.tree = &impl;
  ctx.sizes = &sizes;
  ctx.no_split = &no_split;
  ctx.policy = &policy;
  ctx.tied_groups = FindTiedGroups(impl);
  ctx.tie_index = TieIndex(ctx.tied_groups);
  ctx.offload_buffers = options.offload_buffers;
  ctx.fallback_allocation = options.fallback_allocation;
  ctx.fixes = options.fixes;
  ctx.explain = options.explain;
  if (options.explain) {
    std::string line = "Budgets:";
    for (const Budget& b : budgets) line += fmt::format(" {}={}", b.device.ToKey(), b.bytes.Repr());
    plan->explanation.push_back(line);
  }
  Placement placement = options.strategy == PlanStrategy::kMinMax ? MinMaxPlace(ctx, budgets)
                                                                  : GreedyPlace(ctx, budgets);
  std::vector<DeviceMap::Entry> entries = options.clean_result
                                              ? CleanDeviceMap(placement.map.entries())
                                              : placement.map.entries();
  for (DeviceMap::Entry& e : entries) {
    LOADSTONE_RETURN_IF_ERROR(plan->device_map.Add(std::move(e.prefix), e.device));
  }
  for (std::string& line : placement.explanation) plan->explanation.push_back(std::move(line));
  BufferWarning(placement, budgets, &plan->warnings);
  MinimumWarning(placement, &plan->warnings);
  return Status::OK();
}

}  // namespace

Result<DevicePlan> InferDeviceMapPlaced(const ModuleTree& tree, const DeviceMapOptions& options,
                                        const PlacedTensors& placed) {
  const ModuleTree::Impl& impl = ModuleTreeAccess::Get(tree);
  const Platform& platform = device::OrDefault(options.platform);
  DevicePlan plan;
  LOADSTONE_ASSIGN_OR_RETURN(ModeChoice mode, ParseDeviceMapString(options.device_map));
  if (options.no_split) {
    plan.no_split = *options.no_split;
  } else {
    plan.no_split = DefaultNoSplit(impl);
    plan.default_no_split = true;
  }
  NoSplit no_split(impl, plan.no_split);
  if (!plan.default_no_split) LOADSTONE_RETURN_IF_ERROR(CheckNoSplit(impl, no_split, &plan.warnings));
  CheckSpecialDTypes(impl, options, &plan.warnings);
  SizePolicy policy{options.dtype, options.special_dtypes, options.keep_in_fp32,
                    placed.empty() ? nullptr : &placed};
  ModuleSizes sizes = ComputeModuleSizes(impl, policy);

  Budgets budgets;
  if (mode.mode == Mode::kSingleDevice) {
    if (options.max_memory) {
      LOADSTONE_ASSIGN_OR_RETURN(budgets, GetMaxMemory(options.max_memory, platform, &plan.warnings));
    }
    LOADSTONE_RETURN_IF_ERROR(plan.device_map.Add("", mode.device));
  } else {
    bool balanced = mode.mode != Mode::kSequential && options.strategy == PlanStrategy::kGreedy;
    if (balanced) {
      BalanceInput input{&impl, &sizes, &no_split, &platform};
      LOADSTONE_ASSIGN_OR_RETURN(budgets, GetBalancedMemory(input, options.max_memory,
                                                            mode.mode == Mode::kBalancedLow0,
                                                            &plan.warnings));
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(budgets, GetMaxMemory(options.max_memory, platform, &plan.warnings));
    }
    LOADSTONE_RETURN_IF_ERROR(
        PlaceModules(impl, options, sizes, no_split, policy, budgets, &plan));
  }
  Report(impl, sizes, budgets, &plan);
  PlaceBuffers(impl, options, budgets, &plan);
  return plan;
}

}  // namespace device_map

Result<DevicePlan> InferDeviceMap(const ModuleTree& tree, const DeviceMapOptions& options) {
  return device_map::InferDeviceMapPlaced(tree, options, {});
}

Result<DevicePlan> InferDeviceMap(const Checkpoint& checkpoint, const DeviceMapOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(ModuleTree tree, ModuleTree::FromCheckpoint(checkpoint));
  return InferDeviceMap(tree, options);
}

}  // namespace loadstone
