#include "runtime/plan/plan_warnings.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "runtime/device/platform_impl.h"
#include "runtime/device_map/budgets.h"
#include "runtime/plan/targets.h"

namespace loadstone::planning {

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
  // Packed tensors a target dtype cannot reach: they load as stored, and the plan says so.
  if (options.dtype && !options.keep_packed) {
    std::map<std::string, std::pair<size_t, std::string>> stay_packed;  // scheme → count, first
    for (const TensorInfo& t : checkpoint.tensors()) {
      if (t.packed && DequantOf(t, *options.dtype) == Conversion::kNone) {
        auto& [count, first] = stay_packed[t.packed->scheme];
        if (count++ == 0) first = t.name;
      }
    }
    for (const auto& [scheme, seen] : stay_packed) {
      warnings->push_back(fmt::format(
          "{} {}-packed tensor(s) (the first: '{}') stay packed: loadstone dequantizes {} only",
          seen.first, scheme, seen.second, kDecodable));
    }
  }
  if (options.routes.mmap && options.routes.align_tensors) {
    warnings->push_back(
        "align_tensors does not apply to mapped tensors (mmap): they sit where the file has them; "
        "only converted tensors are 64-byte aligned");
  }
  for (const auto& [name, dtype] : options.special_dtypes) {
    if (checkpoint.Find(name) == nullptr && !options.model) {
      warnings->push_back(fmt::format(
          "special dtype for '{}' names no tensor of the checkpoint; it changes nothing", name));
    }
  }
}

// Options that change nothing once the plan is made: a folder nothing is written to, a mapping
// that converted tensors cannot have, a float8 block with no float8 weight dequantized, budgets
// an explicit map does not use.
void WarnUnused(const Checkpoint& checkpoint, const PlanOptions& options, const LoadPlan& plan,
                std::vector<std::string>* warnings) {
  if (!options.offload_folder.empty() && plan.offloaded.empty()) {
    warnings->push_back(fmt::format(
        "offload_folder '{}' is not used: the device map sends no tensor to disk, so nothing is "
        "written there",
        options.offload_folder));
  }
  if (options.routes.mmap) {
    size_t converted = 0;
    std::string first;
    for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
      if (plan.device_of(t) != Device::Cpu() || plan.tensors[t].conversion == Conversion::kNone) {
        continue;
      }
      if (converted++ == 0) first = checkpoint.tensors()[plan.tensors[t].source].name;
    }
    if (converted > 0) {
      warnings->push_back(fmt::format(
          "mmap maps only tensors loaded as stored: {} of {} CPU tensor(s) are converted (the "
          "first: '{}') and are read, not mapped",
          converted, plan.tensors.size(), first));
    }
  }
  if (options.fp8_block) {
    const bool used = std::any_of(plan.tensors.begin(), plan.tensors.end(), [](const TensorPlan& t) {
      return t.conversion == Conversion::kDequantFp8Block;
    });
    if (!used) {
      warnings->push_back(fmt::format(
          "fp8_block {}x{} changes nothing: {}", (*options.fp8_block)[0], (*options.fp8_block)[1],
          options.dtype ? "no float8 weight with scales is dequantized in this load"
                        : "without a target dtype float8 weights load as stored (give --dtype)"));
    }
  }
  if (options.explicit_map && options.max_memory) {
    // An explicit map is used as given (as accelerate and transformers do): its budgets are not.
    auto budgets = device_map::GetMaxMemory(options.max_memory, device::OrDefault(options.platform),
                                         nullptr);
    std::string over;
    for (const DeviceUsage& u : plan.devices.usage) {
      const device_map::Budget* b = budgets.ok() ? device_map::FindBudget(*budgets, u.device) : nullptr;
      if (b != nullptr && static_cast<double>(u.bytes) > b->bytes.AsDouble()) {
        over += fmt::format("; it sends {} bytes to {}, over its budget of {:.0f}", u.bytes,
                            u.device.ToString(), b->bytes.AsDouble());
      }
    }
    warnings->push_back(
        "max_memory is not used with an explicit device map: every tensor goes where the map "
        "says" + over);
  }
}

}  // namespace loadstone::planning
