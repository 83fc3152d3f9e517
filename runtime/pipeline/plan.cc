#include "loadstone/plan.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/pipeline/fp8_pairs.h"
#include "runtime/planner/planner.h"

namespace loadstone {
namespace {

// Natural order of dotted names: numeric components compare as numbers ("layers.2" before
// "layers.10"), the rest as text.
bool NaturalLess(std::string_view a, std::string_view b) {
  while (!a.empty() && !b.empty()) {
    const size_t ea = std::min(a.find('.'), a.size()), eb = std::min(b.find('.'), b.size());
    const std::string_view ca = a.substr(0, ea), cb = b.substr(0, eb);
    uint64_t na = 0, nb = 0;
    const bool num_a = !ca.empty() && std::from_chars(ca.data(), ca.data() + ca.size(), na).ptr ==
                                          ca.data() + ca.size();
    const bool num_b = !cb.empty() && std::from_chars(cb.data(), cb.data() + cb.size(), nb).ptr ==
                                          cb.data() + cb.size();
    if (num_a && num_b && na != nb) return na < nb;
    if (num_a != num_b) return num_a;  // numbers before names at the same level
    if (ca != cb) return ca < cb;
    a.remove_prefix(std::min(ea + 1, a.size()));
    b.remove_prefix(std::min(eb + 1, b.size()));
  }
  return a.size() < b.size();
}

bool IsReducedFloat(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

// The dtype and conversion of one tensor, whatever its device.
struct Target {
  DType dtype = DType::kF32;
  Conversion conversion = Conversion::kNone;
};

Result<Target> TargetOf(const TensorInfo& t, const PlanOptions& options) {
  Target out{t.dtype, Conversion::kNone};
  std::optional<DType> target;
  if (auto special = options.special_dtypes.find(t.name); special != options.special_dtypes.end()) {
    if (!convert::CanCast(t.dtype, special->second)) {
      return Status::InvalidArgument(fmt::format(
          "special dtype {} for tensor '{}' ({}): loadstone casts f32, f16, bf16, f64 and "
          "float8 tensors to f32, f16 or bf16 only",
          TorchName(special->second), t.name, TorchName(t.dtype)));
    }
    target = special->second;
  } else if (options.dtype && IsFloatingPoint(t.dtype)) {
    target = *options.dtype;
    if (IsReducedFloat(*target)) {
      for (const std::string& pattern : options.keep_in_fp32) {
        if (MatchesModulePattern(t.name, pattern)) target = DType::kF32;
      }
    }
  }
  if (target && *target != t.dtype && convert::CanCast(t.dtype, *target)) {
    out = {*target, Conversion::kCast};
  }
  return out;
}


}  // namespace

bool IsCastTarget(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

namespace {

// The plan's own warnings: options that change nothing for this checkpoint.
void WarnIneffective(const Checkpoint& checkpoint, const PlanOptions& options,
                     std::vector<std::string>* warnings) {
  if (!options.keep_in_fp32.empty()) {
    if (!options.dtype) {
      warnings->push_back(
          "keep_in_fp32 has no effect without a target dtype: every tensor keeps its stored "
          "dtype (give --dtype f16 or bf16)");
    } else if (!IsReducedFloat(*options.dtype)) {
      warnings->push_back(fmt::format(
          "keep_in_fp32 has no effect with the target dtype {}: it only keeps tensors out of f16 "
          "and bf16",
          TorchName(*options.dtype)));
    }
  }
  for (const std::string& pattern : options.keep_in_fp32) {
    const bool any = std::any_of(checkpoint.tensors().begin(), checkpoint.tensors().end(),
                                 [&](const TensorInfo& t) { return MatchesModulePattern(t.name, pattern); });
    if (!any) {
      warnings->push_back(fmt::format(
          "keep_in_fp32 pattern '{}' matches no tensor (a pattern is whole dotted components of "
          "a name, e.g. 'norm' for model.norm.weight)",
          pattern));
    }
  }
  for (const auto& [name, dtype] : options.special_dtypes) {
    if (checkpoint.Find(name) == nullptr && !options.model) {
      warnings->push_back(fmt::format(
          "special dtype for '{}' names no tensor of the checkpoint; it changes nothing", name));
    }
  }
}

// The device map: an explicit one, {"": cpu} for a CPU load, else the planner's answer over
// the model's tree with every tensor sized as it will be placed (`targets`, per checkpoint
// tensor).
Result<DevicePlan> MapDevices(const Checkpoint& checkpoint, const PlanOptions& options,
                              const std::vector<Target>& targets) {
  DevicePlan plan;
  if (options.explicit_map) {
    plan.device_map = *options.explicit_map;
    return plan;
  }
  if (options.device_map == "cpu" && !options.max_memory && !options.model) {
    LOADSTONE_RETURN_IF_ERROR(plan.device_map.Add("", Device::Cpu()));
    return plan;
  }
  planner::PlacedDTypes placed;
  if (options.dtype || !options.special_dtypes.empty()) {
    placed.reserve(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      placed.emplace(checkpoint.tensors()[i].name, targets[i].dtype);
    }
  }
  if (options.model) return planner::InferDeviceMapPlaced(*options.model, options, placed);
  LOADSTONE_ASSIGN_OR_RETURN(ModuleTree tree, ModuleTree::FromCheckpoint(checkpoint));
  return planner::InferDeviceMapPlaced(tree, options, placed);
}

// Bytes per device as the plan places them (`device_of[i]` holds tensor i); budgets and devices
// without tensors are kept.
void CountUsage(const LoadPlan& plan, const std::vector<Device>& device_of,
                std::vector<DeviceUsage>* usage) {
  for (DeviceUsage& u : *usage) u.bytes = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& t = plan.tensors[i];
    const Device device = device_of[i];
    auto it = std::find_if(usage->begin(), usage->end(),
                           [&](const DeviceUsage& u) { return u.device == device; });
    if (it == usage->end()) {
      usage->push_back({device, 0, std::nullopt});
      it = usage->end() - 1;
    }
    it->bytes += t.nbytes;
  }
  std::sort(usage->begin(), usage->end(),
            [](const DeviceUsage& a, const DeviceUsage& b) { return a.device < b.device; });
}

// The first route rule, for a whole tensor: what a read of CPU tensor `tp`, alone in its read,
// takes by the plan's options (ReadRouteOptions).
ReadRoute CpuRoute(const TensorPlan& tp, const ReadRouteOptions& routes) {
  if (tp.conversion != Conversion::kNone) return ReadRoute::kStaged;
  if (routes.mmap) return ReadRoute::kMapped;
  if (tp.fresh_pages) return ReadRoute::kFreshPages;
  return routes.stage_cold_reads ? ReadRoute::kStagedWhenCold : ReadRoute::kInPlace;
}

// Which CPU tensors go into fresh pages (ReadRouteOptions::fill_fresh_pages): 64 KiB and more
// (smaller ones are not worth a mapping of their own), unless mapped.
void ChooseFreshPages(LoadPlan* plan) {
  constexpr uint64_t kFreshMin = 64 << 10;
  if (!plan->routes.fill_fresh_pages) return;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    TensorPlan& tp = plan->tensors[i];
    tp.fresh_pages = plan->device_of(i) == Device::Cpu() && tp.nbytes >= kFreshMin &&
                     !(plan->routes.mmap && tp.conversion == Conversion::kNone);
  }
}

// The read schedule: large tensors in pieces of max_chunk, each routed by CpuRoute (or staged
// for a device); small ones (or small converted ones) gathered, then coalesced with their file
// neighbours into staged reads (mapped ones are not read, so never coalesced); reads ordered
// by the priority of their first tensor.
void ScheduleReads(const std::vector<TensorInfo>& infos, const std::vector<bool>& is_scale,
                   const PlanOptions& options, LoadPlan* out) {
  LoadPlan& plan = *out;
  std::vector<std::pair<uint32_t, ReadChunk>> keyed;  // (priority, read)
  std::vector<uint32_t> small;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& tp = plan.tensors[i];
    const TensorInfo& src = infos[tp.source];
    plan.read_bytes += src.nbytes;
    if (src.nbytes == 0) continue;
    const ReadRoute route = plan.device_of(i) == Device::Cpu() ? CpuRoute(tp, plan.routes)
                                                                 : ReadRoute::kStaged;
    // A dequantized weight and its scales are never coalesced: the scales' read then comes
    // before every read of the weight, whose conversion waits for them.
    const bool fp8_pair = tp.conversion == Conversion::kDequantFp8Block || is_scale[tp.source];
    if (src.nbytes < options.coalesce_below && !fp8_pair && route != ReadRoute::kMapped) {
      small.push_back(i);
      continue;
    }
    for (uint64_t done = 0; done < src.nbytes; done += options.max_chunk) {
      keyed.push_back({i, {src.file, src.offset + done,
                           std::min(options.max_chunk, src.nbytes - done), {i}, route}});
    }
  }
  std::sort(small.begin(), small.end(), [&](uint32_t a, uint32_t b) {
    const TensorInfo& x = infos[plan.tensors[a].source];
    const TensorInfo& y = infos[plan.tensors[b].source];
    return std::tie(x.file, x.offset) < std::tie(y.file, y.offset);
  });
  for (uint32_t i : small) {
    const TensorInfo& src = infos[plan.tensors[i].source];
    if (!keyed.empty()) {
      auto& [key, last] = keyed.back();
      if (last.route == ReadRoute::kStaged && last.file == src.file &&
          last.offset + last.length == src.offset &&
          last.length + src.nbytes <= options.max_chunk) {
        last.length += src.nbytes;
        last.tensors.push_back(i);
        key = std::min(key, i);
        continue;
      }
    }
    keyed.push_back({i, {src.file, src.offset, src.nbytes, {i}, ReadRoute::kStaged}});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  plan.reads.reserve(keyed.size());
  for (auto& [key, read] : keyed) plan.reads.push_back(std::move(read));
}

// LoadPlan::targets from the device of each planned tensor, and TensorPlan::device into it.
void IndexTargets(const std::vector<Device>& device_of, LoadPlan* plan) {
  plan->targets.assign(device_of.begin(), device_of.end());
  std::sort(plan->targets.begin(), plan->targets.end());
  plan->targets.erase(std::unique(plan->targets.begin(), plan->targets.end()), plan->targets.end());
  for (size_t i = 0; i < plan->tensors.size(); ++i) {
    plan->tensors[i].device = static_cast<uint32_t>(
        std::lower_bound(plan->targets.begin(), plan->targets.end(), device_of[i]) -
        plan->targets.begin());
  }
}

Status CheckOptions(const PlanOptions& options) {
  if (options.dtype && !IsCastTarget(*options.dtype)) {
    return Status::InvalidArgument(fmt::format(
        "dtype {}: loadstone casts to float32, float16 or bfloat16 (f32, f16, bf16) only",
        TorchName(*options.dtype)));
  }
  if (options.max_chunk < 4096 || options.max_chunk % 4096 != 0) {
    return Status::InvalidArgument("max_chunk must be a positive multiple of 4096");
  }
  return Status::OK();
}

// Priority order: shard order, then natural name order within a shard.
std::vector<size_t> PriorityOrder(const std::vector<TensorInfo>& infos) {
  std::vector<size_t> order(infos.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (infos[a].file != infos[b].file) return infos[a].file < infos[b].file;
    return NaturalLess(infos[a].name, infos[b].name);
  });
  return order;
}

// What each tensor becomes (float8 scales: as stored; a scaled float8 weight that is converted:
// dequantized), known before any device is.
Result<std::vector<Target>> Targets(const std::vector<TensorInfo>& infos, const PlanOptions& options,
                                    const std::map<size_t, pipeline::Fp8Pair>& fp8_pairs,
                                    const std::vector<bool>& is_scale) {
  PlanOptions as_stored = options;
  as_stored.dtype.reset();
  std::vector<Target> targets(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    LOADSTONE_ASSIGN_OR_RETURN(targets[i], TargetOf(infos[i], is_scale[i] ? as_stored : options));
    if (fp8_pairs.contains(i) && targets[i].conversion != Conversion::kNone) {
      targets[i].conversion = Conversion::kDequantFp8Block;
    }
  }
  return targets;
}

// Fills LoadPlan::tensors in priority order: each included tensor's device (its map entry, or
// where the map placed it as a buffer), dtype and conversion; a scaled float8 weight's scales
// just before it, on the same device.
class TensorPlanner {
 public:
  TensorPlanner(const Checkpoint& checkpoint, const PlanOptions& options,
                const std::vector<Target>& targets,
                const std::map<size_t, pipeline::Fp8Pair>& fp8_pairs,
                const std::vector<bool>& is_scale, LoadPlan* plan)
      : infos_(checkpoint.tensors()), options_(options), targets_(targets),
        fp8_pairs_(fp8_pairs), is_scale_(is_scale), plan_(*plan) {
    for (const BufferPlacement& b : plan_.devices.buffers) {
      if (b.device) buffer_device_.emplace(b.name, *b.device);
    }
    for (const auto& [w, pair] : fp8_pairs_) weight_of_scale_[pair.scale] = w;
  }

  Status AddAll(const std::vector<size_t>& order) {
    plan_.tensors.reserve(order.size());
    device_of_.reserve(order.size());
    for (size_t index : order) {
      if (!Included(index)) continue;
      // Scales are planned just before their weight; alone when only they are included.
      if (is_scale_[index] && Included(weight_of_scale_[index])) continue;
      const auto pair = fp8_pairs_.find(index);
      if (pair == fp8_pairs_.end()) {
        LOADSTONE_RETURN_IF_ERROR(Add(index).status());
      } else {
        LOADSTONE_RETURN_IF_ERROR(AddFp8Pair(index, pair->second));
      }
    }
    return Status::OK();
  }

  const std::vector<Device>& device_of() const { return device_of_; }  // per planned tensor

 private:
  bool Included(size_t i) const { return !options_.include || options_.include(infos_[i]); }

  Result<uint32_t> Add(size_t index) {
    const TensorInfo& t = infos_[index];
    std::optional<Device> device = plan_.devices.device_map.Lookup(t.name);
    if (auto b = buffer_device_.find(t.name); b != buffer_device_.end()) device = b->second;
    if (!device) {
      return Status::InvalidArgument(
          fmt::format("the device map gives no device for tensor '{}'", t.name));
    }
    if (device->type == Device::Type::kDisk || device->type == Device::Type::kMps) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is mapped to {}: disk offload and mps are not supported by the streaming "
          "engine yet; give more memory (--max-memory) or another device map",
          t.name, device->ToString()));
    }
    TensorPlan tp;
    tp.source = index;
    tp.dtype = targets_[index].dtype;
    tp.conversion = targets_[index].conversion;
    tp.nbytes = t.numel() * DTypeBits(tp.dtype) / 8;
    plan_.placed_bytes += tp.nbytes;
    plan_.tensors.push_back(tp);
    device_of_.push_back(*device);
    return static_cast<uint32_t>(plan_.tensors.size() - 1);
  }

  // A weight with scales: the scales first, as stored; a dequantized weight points at them.
  Status AddFp8Pair(size_t index, const pipeline::Fp8Pair& pair) {
    LOADSTONE_ASSIGN_OR_RETURN(const uint32_t s, Add(pair.scale));
    LOADSTONE_ASSIGN_OR_RETURN(const uint32_t w, Add(index));
    if (targets_[index].conversion == Conversion::kNone) return Status::OK();
    TensorPlan& weight = plan_.tensors[w];
    if (device_of_[w] != device_of_[s]) {
      return Status::Unsupported(fmt::format(
          "float8 tensor '{}' is mapped to {} but its scales '{}' to {}; map them together",
          infos_[index].name, device_of_[w].ToString(), infos_[pair.scale].name,
          device_of_[s].ToString()));
    }
    weight.scale = s;
    weight.block_rows = pair.block_rows;
    weight.block_cols = pair.block_cols;
    return Status::OK();
  }

  const std::vector<TensorInfo>& infos_;
  const PlanOptions& options_;
  const std::vector<Target>& targets_;
  const std::map<size_t, pipeline::Fp8Pair>& fp8_pairs_;
  const std::vector<bool>& is_scale_;
  LoadPlan& plan_;
  std::unordered_map<std::string_view, Device> buffer_device_;  // placed apart from the map
  std::map<size_t, size_t> weight_of_scale_;
  std::vector<Device> device_of_;
};

}  // namespace

Result<LoadPlan> Plan(const Checkpoint& checkpoint, const PlanOptions& options) {
  LOADSTONE_RETURN_IF_ERROR(CheckOptions(options));
  const auto& infos = checkpoint.tensors();
  LoadPlan plan;
  plan.checkpoint_fingerprint = checkpoint.fingerprint();
  plan.fp8_block = options.fp8_block ? *options.fp8_block
                   : checkpoint.config().weight_block_size
                       ? *checkpoint.config().weight_block_size
                       : std::array<uint64_t, 2>{128, 128};
  LOADSTONE_ASSIGN_OR_RETURN(const auto fp8_pairs,
                             pipeline::PairFp8Scales(checkpoint, options, plan.fp8_block));
  std::vector<bool> is_scale(infos.size());
  for (const auto& [w, pair] : fp8_pairs) is_scale[pair.scale] = true;
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<Target> targets,
                             Targets(infos, options, fp8_pairs, is_scale));
  LOADSTONE_ASSIGN_OR_RETURN(plan.devices, MapDevices(checkpoint, options, targets));
  plan.warnings = std::move(plan.devices.warnings);
  plan.devices.warnings.clear();
  WarnIneffective(checkpoint, options, &plan.warnings);
  TensorPlanner planner(checkpoint, options, targets, fp8_pairs, is_scale, &plan);
  LOADSTONE_RETURN_IF_ERROR(planner.AddAll(PriorityOrder(infos)));
  CountUsage(plan, planner.device_of(), &plan.devices.usage);
  IndexTargets(planner.device_of(), &plan);
  plan.routes = options.routes;
  ChooseFreshPages(&plan);
  ScheduleReads(infos, is_scale, options, &plan);
  return plan;
}

}  // namespace loadstone
