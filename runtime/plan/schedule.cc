#include "runtime/plan/schedule.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <tuple>
#include <utility>

namespace loadstone::planning {
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

// The route of a read of CPU tensor `tp` that holds it alone, by the plan's ReadRouteOptions.
ReadRoute CpuRoute(const TensorPlan& tp, const ReadRouteOptions& routes) {
  if (tp.conversion != Conversion::kNone) return ReadRoute::kStaged;
  if (routes.mmap) return ReadRoute::kMapped;
  if (tp.fresh_pages) return ReadRoute::kFreshPages;
  return routes.stage_cold_reads ? ReadRoute::kStagedWhenCold : ReadRoute::kInPlace;
}

}  // namespace

std::vector<size_t> PriorityOrder(const std::vector<TensorInfo>& infos) {
  std::vector<size_t> order(infos.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (infos[a].file != infos[b].file) return infos[a].file < infos[b].file;
    return NaturalLess(infos[a].name, infos[b].name);
  });
  return order;
}

void ChooseFreshPages(LoadPlan* plan) {
  constexpr uint64_t kFreshMin = 64 << 10;  // smaller ones: not worth a mapping of their own
  if (!plan->routes.fill_fresh_pages) return;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    TensorPlan& tp = plan->tensors[i];
    tp.fresh_pages = plan->device_of(i) == Device::Cpu() && tp.nbytes >= kFreshMin &&
                     !(plan->routes.mmap && tp.conversion == Conversion::kNone);
  }
}

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

}  // namespace loadstone::planning
