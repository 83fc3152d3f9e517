#include "loadstone/plan.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/formats/offload_folder.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/plan/exec_order.h"
#include "runtime/plan/fp8_pairs.h"
#include "runtime/plan/plan_warnings.h"
#include "runtime/plan/schedule.h"
#include "runtime/plan/targets.h"
#include "runtime/device/platform_impl.h"
#include "runtime/device_map/budgets.h"
#include "runtime/device_map/infer.h"

namespace loadstone {

using planning::DequantOf;
using planning::IsReducedFloat;
using planning::kDecodable;
using planning::PlacedElements;
using planning::Target;
using planning::Targets;

bool IsCastTarget(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

namespace {

// The device map: an explicit one, {"": cpu} for a CPU load, else the planner's answer over
// the model's tree with every tensor sized as it will be placed (`targets`, per checkpoint
// tensor).
Result<DevicePlan> MapDevices(const Checkpoint& checkpoint, const PlanOptions& options,
                              const std::vector<Target>& targets) {
  DevicePlan plan;
  if (options.explicit_map) {
    plan.device_map = *options.explicit_map;
    // Keys that name no module are reported (check_device_map); every tensor planned must have
    // a key (TensorPlanner::Add), those an `include` leaves out need none.
    if (options.model) {
      plan.warnings = device_map::UnknownMapKeys(*options.model, plan.device_map);
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(ModuleTree tree, ModuleTree::FromCheckpoint(checkpoint));
      plan.warnings = device_map::UnknownMapKeys(tree, plan.device_map);
    }
    return plan;
  }
  if (options.device_map == "cpu" && !options.max_memory && !options.model) {
    LOADSTONE_RETURN_IF_ERROR(plan.device_map.Add("", Device::Cpu()));
    return plan;
  }
  device_map::PlacedTensors placed;
  if (options.dtype || !options.special_dtypes.empty()) {
    placed.reserve(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      const TensorInfo& t = checkpoint.tensors()[i];
      placed.emplace(t.name, device_map::PlacedTensor{targets[i].dtype,
                                                   PlacedElements(t, targets[i].conversion)});
    }
  }
  if (options.model) return device_map::InferDeviceMapPlaced(*options.model, options, placed);
  LOADSTONE_ASSIGN_OR_RETURN(ModuleTree tree, ModuleTree::FromCheckpoint(checkpoint));
  return device_map::InferDeviceMapPlaced(tree, options, placed);
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
  if (!plan.offloaded.empty()) {
    auto it = std::find_if(usage->begin(), usage->end(),
                           [](const DeviceUsage& u) { return u.device == Device::Disk(); });
    if (it == usage->end()) {
      usage->push_back({Device::Disk(), 0, std::nullopt});
      it = usage->end() - 1;
    }
    it->bytes = plan.offloaded_bytes;
  }
  std::sort(usage->begin(), usage->end(),
            [](const DeviceUsage& a, const DeviceUsage& b) { return a.device < b.device; });
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

// Fills LoadPlan::tensors in priority order: each included tensor's device (its map entry, or
// where the map placed it as a buffer), dtype and conversion; a scaled float8 weight's scales
// just before it, on the same device.
class TensorPlanner {
 public:
  TensorPlanner(const Checkpoint& checkpoint, const PlanOptions& options,
                const std::vector<Target>& targets,
                const std::map<size_t, planning::ScalePair>& scale_pairs,
                const std::vector<bool>& is_scale, LoadPlan* plan)
      : infos_(checkpoint.tensors()), format_(checkpoint.format()),
        file_of_([&checkpoint](const TensorInfo& t) { return checkpoint.files()[t.file].path; }),
        options_(options), targets_(targets),
        scale_pairs_(scale_pairs), is_scale_(is_scale), plan_(*plan) {
    for (const BufferPlacement& b : plan_.devices.buffers) {
      if (b.device) buffer_device_.emplace(b.name, *b.device);
    }
    for (const auto& [w, pair] : scale_pairs_) weight_of_scale_[pair.scale] = w;
  }

  Status AddAll(const std::vector<size_t>& order) {
    plan_.tensors.reserve(order.size());
    device_of_.reserve(order.size());
    for (size_t index : order) {
      if (!Included(index)) continue;
      // Scales are planned just before their weight; alone when only they are included.
      if (is_scale_[index] && Included(weight_of_scale_[index])) continue;
      const auto pair = scale_pairs_.find(index);
      if (pair == scale_pairs_.end()) {
        LOADSTONE_RETURN_IF_ERROR(Add(index).status());
      } else {
        LOADSTONE_RETURN_IF_ERROR(AddScalePair(index, pair->second));
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
    if (device->type == Device::Type::kMps) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is mapped to mps: loadstone places tensors on CUDA GPUs, the CPU and disk; "
          "give another device map",
          t.name));
    }
    if (!t.plain_layout() && targets_[index].conversion == Conversion::kDequantFp8Block) {
      return Status::Unsupported(fmt::format(
          "float8 tensor '{}' is {} in its file: loadstone dequantizes contiguous little-endian "
          "float8 weights only; rewrite the checkpoint with `loadstone convert`",
          t.name, t.strides.empty() ? "big-endian" : "a strided view"));
    }
    const uint64_t materialised = t.numel() * (DTypeBits(t.dtype) / 8);
    if (!t.strides.empty() && std::max(t.nbytes, materialised) > planning::kMaxRelayoutSpan) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is a strided view spanning {} bytes of its storage that becomes {} bytes "
          "contiguous; loadstone gathers a strided tensor whole, at most {} bytes; save the "
          "tensor contiguous (.contiguous()) and load that",
          t.name, t.nbytes, materialised, planning::kMaxRelayoutSpan));
    }
    // Read whole into staging: bounded like a strided view (the decoded values go straight to
    // the tensor, or to a device that decodes them).
    if (targets_[index].conversion == Conversion::kDequantPackedInt &&
        t.packed->packed_int->transposed() && t.nbytes > planning::kMaxRelayoutSpan) {
      return Status::Unsupported(fmt::format(
          "{} weight '{}' is {} bytes; loadstone dequantizes a GPTQ or AWQ weight read whole, at "
          "most {} bytes: load it packed (--keep-packed)",
          t.packed->scheme, t.name, t.nbytes, planning::kMaxRelayoutSpan));
    }
    if (device->type == Device::Type::kDisk) return Offload(index);
    TensorPlan tp;
    tp.source = index;
    tp.dtype = targets_[index].dtype;
    tp.conversion = targets_[index].conversion;
    tp.nbytes = PlacedElements(t, tp.conversion) * DTypeBits(tp.dtype) / 8;
    plan_.placed_bytes += tp.nbytes;
    plan_.tensors.push_back(tp);
    device_of_.push_back(*device);
    return static_cast<uint32_t>(plan_.tensors.size() - 1);
  }

  // A tensor mapped to disk: planned apart (LoadPlan::offloaded), read in place when it is a
  // plain safetensors tensor, else written to the offload folder, which must then be given.
  Result<uint32_t> Offload(size_t index) {
    const TensorInfo& t = infos_[index];
    OffloadPlan op;
    op.source = index;
    op.dtype = targets_[index].dtype;
    op.conversion = targets_[index].conversion;
    if (op.conversion == Conversion::kDequantFp8Block) {
      return Status::Unsupported(fmt::format(
          "float8 tensor '{}' is mapped to disk with a target dtype: loadstone offloads float8 "
          "weights as stored only; map it to a device, or load without a dtype",
          t.name));
    }
    // A GGUF block tensor is dequantized, then written; a weight with a quant state beside it
    // (bitsandbytes, GPTQ, ...) would need that state in the folder too.
    if (t.packed && (op.conversion != Conversion::kDequantBlocks || !t.packed->companions().empty())) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is {}-packed and mapped to disk: loadstone offloads plain tensors and "
          "GGUF blocks dequantized with a dtype (--dtype f32, f16 or bf16); {}",
          t.name, t.packed->scheme,
          t.packed->companions().empty() ? "give a dtype, or map it to a device"
                                         : "map it to a device"));
    }
    op.shape = t.packed ? t.packed->element_shape : t.shape;
    op.nbytes = PlacedElements(t, op.conversion) * DTypeBits(op.dtype) / 8;
    op.in_place = options_.offload_in_place && format_ == CheckpointFormat::kSafetensors &&
                  t.plain_layout();
    if (!op.in_place) {
      // Checked now, before any load: what WriteOffload will write must be writable.
      LOADSTONE_RETURN_IF_ERROR(io::CheckOffloadName(t.name));
      if (!io::OffloadDTypeName(op.dtype)) {
        return Status::Unsupported(fmt::format(
            "tensor '{}' is {} and mapped to disk: accelerate's offload folder stores numpy "
            "dtypes, which have no {}; map it to a device or give a dtype it can be cast to",
            t.name, TorchName(op.dtype), TorchName(op.dtype)));
      }
    }
    if (!op.in_place && options_.offload_folder.empty()) {
      DeviceMap disk;
      (void)disk.Add("", Device::Disk());
      Status needs = CheckDiskOffload(disk, "", false);
      return Status(needs.code(), fmt::format("{} (tensor '{}' of '{}' is mapped to disk and is "
                                              "not a safetensors tensor that can be read in place)",
                                              needs.message(), t.name, file_of_(t)));
    }
    plan_.offloaded_bytes += op.nbytes;
    plan_.offloaded.push_back(op);
    return kOffloaded;
  }

  // A weight with scales: the scales first, as stored; a dequantized weight points at them.
  Status AddScalePair(size_t index, const planning::ScalePair& pair) {
    const TensorInfo& wt = infos_[index];
    const TensorInfo& sc = infos_[pair.scale];
    if (wt.file == sc.file && wt.offset < sc.offset + sc.nbytes &&
        sc.offset < wt.offset + wt.nbytes) {
      // One read would then hold both, and the weight's conversion wait for itself.
      return Status::Unsupported(fmt::format(
          "quantized tensor '{}' shares bytes of '{}' with its scales '{}'; loadstone does not "
          "dequantize a weight from bytes that are also its scales",
          wt.name, file_of_(wt), sc.name));
    }
    LOADSTONE_ASSIGN_OR_RETURN(const uint32_t s, Add(pair.scale));
    LOADSTONE_ASSIGN_OR_RETURN(const uint32_t w, Add(index));
    if (targets_[index].conversion == Conversion::kNone) return Status::OK();
    if (s == kOffloaded || w == kOffloaded) {
      return Status::Unsupported(fmt::format(
          "quantized tensor '{}' and its scales '{}' are split between disk and a device; map "
          "them together",
          infos_[index].name, infos_[pair.scale].name));
    }
    TensorPlan& weight = plan_.tensors[w];
    // A bitsandbytes weight is decoded by a CPU worker, on whatever device it goes: its absmax
    // (SCB) is an input of that decode, kept in host memory.
    if (!CompanionsOf(index).empty()) {
      device_of_[s] = Device::Cpu();
    } else if (device_of_[w] != device_of_[s]) {
      return Status::Unsupported(fmt::format(
          "quantized tensor '{}' is mapped to {} but its scales '{}' to {}; map them together",
          infos_[index].name, device_of_[w].ToString(), infos_[pair.scale].name,
          device_of_[s].ToString()));
    }
    weight.scale = s;
    weight.block_rows = pair.block_rows;
    weight.block_cols = pair.block_cols;
    return Status::OK();
  }

  static constexpr uint32_t kOffloaded = UINT32_MAX;  // Add's answer for a tensor sent to disk

  // The quant-state tensors of tensor `index` (none unless it is a bitsandbytes weight).
  const std::vector<std::string>& CompanionsOf(size_t index) const {
    static const std::vector<std::string> kNone;
    return infos_[index].packed ? infos_[index].packed->companions() : kNone;
  }

  const std::vector<TensorInfo>& infos_;
  const CheckpointFormat format_;
  const std::function<std::string(const TensorInfo&)> file_of_;
  const PlanOptions& options_;
  const std::vector<Target>& targets_;
  const std::map<size_t, planning::ScalePair>& scale_pairs_;
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
  LOADSTONE_ASSIGN_OR_RETURN(auto scale_pairs,
                             planning::PairFp8Scales(checkpoint, options, plan.fp8_block));
  std::vector<bool> is_scale(infos.size());
  std::vector<bool> keep_stored(infos.size());  // scales and every quant-state tensor
  LOADSTONE_RETURN_IF_ERROR(planning::PairQuantStates(checkpoint, &scale_pairs, &keep_stored));
  for (const auto& [w, pair] : scale_pairs) is_scale[pair.scale] = keep_stored[pair.scale] = true;
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<Target> targets,
                             Targets(infos, options, scale_pairs, keep_stored));
  LOADSTONE_ASSIGN_OR_RETURN(plan.devices, MapDevices(checkpoint, options, targets));
  plan.warnings = std::move(plan.devices.warnings);
  plan.devices.warnings.clear();
  planning::WarnIneffective(checkpoint, options, &plan.warnings);
  LOADSTONE_ASSIGN_OR_RETURN(const planning::TensorOrdering ordering,
                             planning::OrderTensors(checkpoint, options));
  TensorPlanner planner(checkpoint, options, targets, scale_pairs, is_scale, &plan);
  LOADSTONE_RETURN_IF_ERROR(planner.AddAll(ordering.order));
  plan.order = options.order;
  planning::CutModules(ordering.module, &plan);
  plan.offload_folder = options.offload_folder;
  CountUsage(plan, planner.device_of(), &plan.devices.usage);
  planning::IndexTargets(planner.device_of(), &plan);
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    if (plan.device_of(t) != Device::Cpu()) continue;
    TensorPlan& tp = plan.tensors[t];
    tp.caller_memory = options.caller_memory && options.caller_memory(infos[tp.source]);
    tp.pinned = options.pin_cpu_tensors && !tp.caller_memory;
  }
  plan.routes = options.routes;
  planning::WarnUnused(checkpoint, options, plan, &plan.warnings);
  planning::ChooseFreshPages(&plan);
  LOADSTONE_RETURN_IF_ERROR(planning::ScheduleReads(infos, is_scale, options, &plan));
  planning::ChooseConversionSites(checkpoint, device::OrDefault(options.platform), &plan);
  return plan;
}

}  // namespace loadstone
