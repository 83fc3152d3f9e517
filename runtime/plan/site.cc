// ChooseConversionSites / CheckConversionSites: where each planned tensor's conversion runs
// (TensorPlan::conversion_site) — the decision the executor carries out at load time — by one
// rule.
#include <algorithm>

#include <fmt/format.h>

#include "runtime/plan/check_plan.h"
#include "runtime/plan/schedule.h"

namespace loadstone::planning {
namespace {

// The site of tensor `t`, on a GPU that decodes quantized weights when `gpu_decodes`.
ConversionSite SiteFor(const Checkpoint& checkpoint, const LoadPlan& plan, uint32_t t,
                       bool gpu_decodes) {
  const TensorPlan& tp = plan.tensors[t];
  if (plan.device_of(t) == Device::Cpu()) {
    return tp.conversion == Conversion::kNone ? ConversionSite::kNone : ConversionSite::kCpu;
  }
  if (Unpacks(tp.conversion)) {
    return gpu_decodes ? ConversionSite::kDevice : ConversionSite::kCpuThenDevice;
  }
  // A strided or big-endian tensor is gathered by a worker first (kRelayout, or a cast of it).
  if (!checkpoint.tensors()[tp.source].plain_layout()) return ConversionSite::kCpuThenDevice;
  return tp.conversion == Conversion::kNone ? ConversionSite::kNone : ConversionSite::kDevice;
}

// Per LoadPlan::targets entry: whether that device decodes quantized weights itself — a GPU the
// platform describes says (PlatformGpu::decodes_quantized); any other GPU is taken to have the
// CUDA backend's kernels. Asked of the platform only when a quantized weight goes to a GPU.
std::vector<bool> TargetsDecode(const LoadPlan& plan, const Platform& platform) {
  std::vector<bool> decodes(plan.targets.size(), true);
  const bool asks = std::any_of(plan.tensors.begin(), plan.tensors.end(), [&](const TensorPlan& tp) {
    return Unpacks(tp.conversion) && plan.targets[tp.device].is_gpu();
  });
  if (!asks) return decodes;
  const std::vector<PlatformGpu> gpus = platform.Gpus();
  for (size_t d = 0; d < plan.targets.size(); ++d) {
    const Device& target = plan.targets[d];
    const auto n = static_cast<size_t>(target.index);
    if (target.is_gpu() && target.index >= 0 && n < gpus.size()) {
      decodes[d] = gpus[n].decodes_quantized;
    }
  }
  return decodes;
}

}  // namespace

void ChooseConversionSites(const Checkpoint& checkpoint, const Platform& platform,
                           LoadPlan* plan) {
  const std::vector<bool> decodes = TargetsDecode(*plan, platform);
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) {
    TensorPlan& tp = plan->tensors[t];
    tp.conversion_site = SiteFor(checkpoint, *plan, t, decodes[tp.device]);
  }
}

Status CheckConversionSites(const Checkpoint& checkpoint, const LoadPlan& plan) {
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const ConversionSite site = plan.tensors[t].conversion_site;
    const ConversionSite with = SiteFor(checkpoint, plan, t, true);
    const ConversionSite without = SiteFor(checkpoint, plan, t, false);
    if (site == with || site == without) continue;
    return Status::InvalidArgument(fmt::format(
        "this plan cannot be loaded: tensor '{}' is planned to be converted on site '{}', but "
        "its conversion, layout and device make it '{}'{}; plan it again with Plan()",
        checkpoint.tensors()[plan.tensors[t].source].name, ConversionSiteName(site),
        ConversionSiteName(with),
        with == without ? "" : fmt::format(" (or '{}')", ConversionSiteName(without))));
  }
  return Status::OK();
}

}  // namespace loadstone::planning
