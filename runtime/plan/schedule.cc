#include "runtime/plan/schedule.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "runtime/plan/exec_order.h"

namespace loadstone::planning {
namespace {

// Memory of this size or more is worth a fresh-pages mapping of its own (a tensor, or a shared
// buffer); smaller: not worth the mapping.
constexpr uint64_t kFreshPagesMin = 64 << 10;

// The route of a read into CPU memory that needs no conversion (one tensor, or a shared buffer),
// by the plan's ReadRouteOptions; `fresh`: that memory is fresh pages.
ReadRoute UnconvertedCpuRoute(bool fresh, const ReadRouteOptions& routes) {
  if (routes.mmap) return ReadRoute::kMapped;
  if (fresh) return ReadRoute::kFreshPages;
  return RouteWithoutFreshPages(routes);
}

ReadRoute RouteOf(const LoadPlan& plan, uint32_t t) {
  if (!IsUnconvertedCpu(plan, t)) return ReadRoute::kStaged;
  // Memory from elsewhere (the caller's, pinned) is never mapped nor fresh pages.
  if (plan.tensors[t].memory_given()) return RouteWithoutFreshPages(plan.routes);
  return UnconvertedCpuRoute(plan.tensors[t].fresh_pages, plan.routes);
}

// Small tensors (`small`, sorted by file offset) coalesced with their file neighbours: those
// that can share a buffer (unconverted, CPU, no 64-byte alignment asked) into shared reads,
// the others into staged reads; a read grows while the next tensor follows it in the same file,
// at most `gap` bytes after its end (PlanOptions::coalesce_gap; the gap is read too: a PyTorch
// archive puts a zip header between storages), and the read stays within max_chunk. Only reads made here grow: a
// large tensor's last piece keeps its own priority (a float8 weight's pieces then never go
// before its scales).
void CoalesceSmall(const std::vector<TensorInfo>& infos, const std::vector<uint32_t>& small,
                   uint64_t max_chunk, uint64_t gap, LoadPlan* plan,
                   std::vector<std::pair<uint32_t, ReadChunk>>* keyed) {
  const size_t first_small = keyed->size();
  for (uint32_t i : small) {
    const TensorInfo& src = infos[plan->tensors[i].source];
    const bool share = RouteOf(*plan, i) != ReadRoute::kStaged && !plan->routes.align_tensors &&
                       !plan->tensors[i].memory_given();
    if (keyed->size() > first_small) {
      auto& [key, last] = keyed->back();
      const uint64_t end = last.offset + last.length;
      if (last.route == ReadRoute::kStaged && last.shared_buffer == share &&
          last.file == src.file && src.offset >= end && src.offset - end <= gap &&
          src.offset + src.nbytes - last.offset <= max_chunk) {
        plan->read_bytes += src.offset - end;
        last.length = src.offset + src.nbytes - last.offset;
        last.tensors.push_back(i);
        key = std::min(key, i);
        continue;
      }
    }
    ReadChunk read{src.file, src.offset, src.nbytes, {i}, ReadRoute::kStaged};
    read.shared_buffer = share;
    keyed->push_back({i, std::move(read)});
  }
  // A shared buffer is one block of CPU memory, fresh pages when it is large enough to be worth
  // a mapping (ChooseFreshPages' rule, for the block), and routed as one unconverted tensor.
  // One whose gaps hold more bytes than its tensors (tiny storages between zip headers) would
  // keep that waste alive with them: its tensors are copied out of staging instead.
  for (auto& [key, read] : *keyed) {
    if (!read.shared_buffer) continue;
    uint64_t payload = 0;
    for (uint32_t t : read.tensors) payload += infos[plan->tensors[t].source].nbytes;
    if (read.length > 2 * payload) {
      read.shared_buffer = false;
      continue;
    }
    const bool fresh = plan->routes.fill_fresh_pages && read.length >= kFreshPagesMin;
    for (uint32_t t : read.tensors) plan->tensors[t].fresh_pages = fresh;
    read.route = UnconvertedCpuRoute(fresh, plan->routes);
  }
}

// The planned tensors that are read (bytes, not mapped), in file order: (file, offset) and
// then their index. A catalog in file order needs no comparison: its tensors by source index
// (a counting sort); another's keys are sorted side by side, not by index into the catalog.
std::vector<uint32_t> InFileOrder(const std::vector<TensorInfo>& infos, const LoadPlan& plan) {
  const auto read = [&](uint32_t i, const TensorInfo& t) {
    return t.nbytes > 0 && RouteOf(plan, i) != ReadRoute::kMapped;
  };
  std::vector<uint32_t> order;
  order.reserve(plan.tensors.size());
  if (FileOrdered(infos)) {
    std::vector<uint32_t> start(infos.size() + 1, 0);
    for (const TensorPlan& tp : plan.tensors) ++start[tp.source + 1];
    for (size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    std::vector<uint32_t> by_source(plan.tensors.size());
    for (uint32_t i = 0; i < plan.tensors.size(); ++i) by_source[start[plan.tensors[i].source]++] = i;
    // Tensors at one offset (views of one storage): by index, as the keys would order them.
    const TensorInfo* run_of = nullptr;  // the tensor at the offset of the run `order` ends in
    size_t run = 0;
    for (uint32_t i : by_source) {
      const TensorInfo& t = infos[plan.tensors[i].source];
      if (!read(i, t)) continue;
      if (run_of == nullptr || t.file != run_of->file || t.offset != run_of->offset) {
        std::sort(order.begin() + run, order.end());
        run = order.size();
        run_of = &t;
      }
      order.push_back(i);
    }
    std::sort(order.begin() + run, order.end());
    return order;
  }
  std::vector<std::tuple<uint32_t, uint64_t, uint32_t>> keys;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo& t = infos[plan.tensors[i].source];
    if (read(i, t)) keys.emplace_back(t.file, t.offset, i);
  }
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) order.push_back(std::get<2>(key));
  return order;
}

// Planned tensors whose file bytes overlap others' (views of one PyTorch storage, tied weights),
// as groups of two or more in file order; `order`: InFileOrder's.
std::vector<std::vector<uint32_t>> OverlapGroups(const std::vector<TensorInfo>& infos,
                                                 const LoadPlan& plan,
                                                 const std::vector<uint32_t>& order) {
  auto info = [&](uint32_t i) -> const TensorInfo& { return infos[plan.tensors[i].source]; };
  std::vector<std::vector<uint32_t>> groups;
  std::vector<uint32_t> group;
  uint64_t end = 0;
  for (uint32_t i : order) {
    const TensorInfo& t = info(i);
    if (!group.empty() && (t.file != info(group.front()).file || t.offset >= end)) {
      if (group.size() > 1) groups.push_back(std::move(group));
      group.clear();
    }
    if (group.empty()) end = 0;
    group.push_back(i);
    end = std::max(end, t.offset + t.nbytes);
  }
  if (group.size() > 1) groups.push_back(std::move(group));
  return groups;
}

// The reads of one overlap group: its bytes once, each read listing the tensors it holds part of.
Status ScheduleGroup(const std::vector<TensorInfo>& infos, const std::vector<uint32_t>& group,
                     uint64_t max_chunk, const LoadPlan& plan,
                     std::vector<std::pair<uint32_t, ReadChunk>>* keyed) {
  auto info = [&](uint32_t i) -> const TensorInfo& { return infos[plan.tensors[i].source]; };
  const uint64_t lo = info(group.front()).offset;
  uint64_t hi = lo;
  // Read whole: a group with a strided view (gathered from one piece) or a GPTQ/AWQ weight to
  // decode (an output row spans it), or one whose members do not start on a whole element from
  // the group's start (pieces of max_chunk, a multiple of every element size, would then cut an
  // element).
  bool whole = false;
  for (uint32_t i : group) {
    hi = std::max(hi, info(i).offset + info(i).nbytes);
    const uint64_t elem = std::max(1, DTypeBits(info(i).dtype) / 8);
    const bool transposed = plan.tensors[i].conversion == Conversion::kDequantPackedInt &&
                            info(i).packed->packed_int->transposed();  // GPTQ, AWQ decoded
    whole = whole || !info(i).strides.empty() || (info(i).offset - lo) % elem != 0 || transposed;
  }
  if (whole && hi - lo > kMaxRelayoutSpan) {
    return Status::Unsupported(fmt::format(
        "tensor '{}' and {} others share {} bytes of their file, among them a strided view or "
        "views that do not start on a whole element: loadstone reads such a group in one piece "
        "and at most {} bytes at once; save the tensors contiguous and load that",
        info(group.front()).name, group.size() - 1, hi - lo, kMaxRelayoutSpan));
  }
  const uint64_t piece = whole ? hi - lo : max_chunk;
  for (uint64_t at = lo; at < hi; at += piece) {
    ReadChunk read{info(group.front()).file, at, std::min(piece, hi - at), {}, ReadRoute::kStaged};
    uint32_t key = UINT32_MAX;
    for (uint32_t i : group) {
      const TensorInfo& t = info(i);
      if (t.offset < read.offset + read.length && read.offset < t.offset + t.nbytes) {
        read.tensors.push_back(i);
        key = std::min(key, i);
      }
    }
    if (!read.tensors.empty()) keyed->push_back({key, std::move(read)});
  }
  return Status::OK();
}

}  // namespace

ReadRoute RouteWithoutFreshPages(const ReadRouteOptions& routes) {
  return routes.stage_cold_reads ? ReadRoute::kStagedWhenCold : ReadRoute::kInPlace;
}

void ChooseFreshPages(LoadPlan* plan) {
  if (!plan->routes.fill_fresh_pages) return;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    TensorPlan& tp = plan->tensors[i];
    tp.fresh_pages = plan->device_of(i) == Device::Cpu() && tp.nbytes >= kFreshPagesMin &&
                     !(plan->routes.mmap && tp.conversion == Conversion::kNone) &&
                     !tp.memory_given();
  }
}

namespace {

// The bytes of each read of a tensor read alone: max_chunk, but a strided tensor is gathered
// from its whole span at once (Plan() bounds that span) and a dequantized packed one is read in
// whole blocks.
uint64_t PieceBytes(const TensorInfo& src, const TensorPlan& tp, bool on_device,
                    const PlanOptions& options) {
  uint64_t piece = src.strides.empty() ? options.max_chunk : src.nbytes;
  if (tp.conversion == Conversion::kDequantBlocks || (Unpacks(tp.conversion) && on_device)) {
    // Whole blocks (GGUF; a word for compressed-tensors, a byte for bitsandbytes), and, where
    // a worker decodes into host memory for a device to copy (Placer::Dequantize), few enough
    // that the decoded piece fits max_chunk too: up to 16x the bytes read.
    uint64_t in_block = src.packed->block_bytes, elems = src.packed->block_elems;
    if (tp.conversion == Conversion::kDequantBnb4) in_block = 1, elems = 2;
    if (tp.conversion == Conversion::kDequantBnb8) in_block = 1, elems = 1;
    const uint64_t out_block = elems * (DTypeBits(tp.dtype) / 8);
    piece = std::max<uint64_t>(1, options.max_chunk / std::max(out_block, in_block)) * in_block;
  }
  if (tp.conversion == Conversion::kDequantPackedInt && src.packed->packed_int->transposed()) {
    piece = src.nbytes;  // GPTQ, AWQ: an output row's codes span the tensor (Plan() bounds it)
  }
  return piece;
}

}  // namespace

Status ScheduleReads(const std::vector<TensorInfo>& infos, const std::vector<bool>& is_scale,
                     const PlanOptions& options, LoadPlan* out) {
  LoadPlan& plan = *out;
  std::vector<std::pair<uint32_t, ReadChunk>> keyed;  // (priority, read)
  std::vector<bool> grouped(plan.tensors.size());
  const std::vector<uint32_t> in_file_order = InFileOrder(infos, plan);
  for (const std::vector<uint32_t>& group : OverlapGroups(infos, plan, in_file_order)) {
    const size_t first = keyed.size();
    LOADSTONE_RETURN_IF_ERROR(ScheduleGroup(infos, group, options.max_chunk, plan, &keyed));
    for (size_t r = first; r < keyed.size(); ++r) plan.read_bytes += keyed[r].second.length;
    for (uint32_t i : group) grouped[i] = true;
  }
  std::vector<bool> is_small(plan.tensors.size());
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorPlan& tp = plan.tensors[i];
    const TensorInfo& src = infos[tp.source];
    if (grouped[i]) continue;
    plan.read_bytes += src.nbytes;
    if (src.nbytes == 0) continue;
    const ReadRoute route = RouteOf(plan, i);
    // A dequantized weight and its scales are never coalesced: the scales' read then comes
    // before every read of the weight, whose conversion waits for them.
    const bool fp8_pair = UsesScales(tp.conversion) || is_scale[tp.source];
    // Small: below coalesce_below, and never above max_chunk (no read is longer than that).
    const uint64_t small_below = std::min(options.coalesce_below, options.max_chunk);
    if (src.nbytes < small_below && !fp8_pair && route != ReadRoute::kMapped) {
      is_small[i] = true;
      continue;
    }
    const uint64_t piece = PieceBytes(src, tp, plan.device_of(i) != Device::Cpu(), options);
    for (uint64_t done = 0; done < src.nbytes; done += piece) {
      keyed.push_back({i, {src.file, src.offset + done, std::min(piece, src.nbytes - done), {i},
                           route}});
    }
  }
  std::vector<uint32_t> small;  // by file offset (small tensors are read: in in_file_order)
  for (uint32_t i : in_file_order) {
    if (is_small[i]) small.push_back(i);
  }
  CoalesceSmall(infos, small, options.max_chunk, std::min(options.coalesce_gap, kCoalesceGap),
                &plan, &keyed);
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  plan.reads.reserve(keyed.size());
  for (auto& [key, read] : keyed) plan.reads.push_back(std::move(read));
  ChooseMemory(&plan);
  return Status::OK();
}

void IndexTargets(const std::vector<Device>& device_of, LoadPlan* plan) {
  // The distinct devices, sorted: a handful, found in one pass (not by sorting every tensor's).
  plan->targets.clear();
  for (const Device& d : device_of) {
    if (!plan->targets.empty() && plan->targets.back() == d) continue;  // runs of one device
    const auto at = std::lower_bound(plan->targets.begin(), plan->targets.end(), d);
    if (at == plan->targets.end() || *at != d) plan->targets.insert(at, d);
  }
  for (size_t i = 0; i < plan->tensors.size(); ++i) {
    plan->tensors[i].device = static_cast<uint32_t>(
        std::lower_bound(plan->targets.begin(), plan->targets.end(), device_of[i]) -
        plan->targets.begin());
  }
}

}  // namespace loadstone::planning
