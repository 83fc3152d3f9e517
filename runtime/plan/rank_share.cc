// ShareOf (include/loadstone/tensor_parallel.h): each tensor's split under the tensor-parallel
// plan (tp_rules.h) and the part or row block this rank reads, as a catalog over the same files.
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "io/formats/json_util.h"
#include "io/formats/limits.h"
#include "loadstone/tensor_parallel.h"
#include "runtime/plan/ep_rules.h"
#include "runtime/plan/pp_rules.h"
#include "runtime/plan/tp_rules.h"

namespace loadstone {
namespace {

using planning::TpPlan;

Status CheckOptions(const ParallelOptions& o) {
  if (o.world_size < 1 || o.tp < 1 || o.pp < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument(fmt::format(
        "rank {} of a world of {} with tensor-parallel degree {} and {} pipeline stages: the "
        "world size and the degrees are at least 1 and a rank is 0 .. world size - 1",
        o.rank, o.world_size, o.tp, o.pp));
  }
  if (o.world_size % (static_cast<int64_t>(o.tp) * o.pp) != 0) {
    return Status::InvalidArgument(fmt::format(
        "tensor-parallel degree {} × pipeline stages {} does not divide the world size {}: give "
        "a --tp and --pp that do (and the world size with --world-size, or run the ranks with "
        "loadstone launch -n N)",
        o.tp, o.pp, o.world_size));
  }
  if (o.bucket_bytes == 0) return Status::InvalidArgument("exchange bucket of 0 bytes");
  if (!o.pp_layers.empty() && o.pp == 1) {
    return Status::InvalidArgument(
        "layers per pipeline stage (--pp-layers) were given for one stage: give --pp P with "
        "them, or leave them out");
  }
  if (o.expert_parallel && o.tp == 1) {
    return Status::InvalidArgument(
        "expert parallelism (--ep) splits the experts over each tensor-parallel group: give "
        "--tp 2 or more with it");
  }
  if (!o.ep_plan_json.empty() && !o.expert_parallel) {
    return Status::InvalidArgument(
        "an expert-parallel plan (--ep-plan) was given without expert parallelism: add --ep");
  }
  return Status::OK();
}

// The checkpoint's config.json (empty when it has none).
Result<std::string> ConfigText(const Checkpoint& checkpoint) {
  const std::string& path = checkpoint.config().path;
  if (path.empty()) return std::string();
  return io::ReadSmallFile(path, "config.json", io::kMaxConfigBytes, "kMaxConfigBytes");
}

Result<TpPlan> TpPlanFor(const Checkpoint& checkpoint, const ParallelOptions& options,
                         std::string_view config, std::span<const std::string> names) {
  if (!options.tp_plan_json.empty()) {
    auto plan = TpPlan::FromJson(options.tp_plan_json);
    if (!plan.ok()) return plan.status().WithContext("the tensor-parallel plan given");
    return plan;
  }
  if (config.empty()) {
    return Status::NotFound(
        "the checkpoint has no config.json to take a tensor-parallel plan from: give one "
        "(--tp-plan FILE.json, ParallelOptions::tp_plan_json)");
  }
  auto plan = planning::TpPlanFromConfig(config, names);
  if (!plan.ok()) return plan.status().WithContext(checkpoint.config().path);
  return plan;
}

// The tensor-parallel plan, with the expert-parallel one over it when asked.
Result<TpPlan> PlanFor(const Checkpoint& checkpoint, const ParallelOptions& options,
                       std::string_view config, std::span<const std::string> names) {
  LOADSTONE_ASSIGN_OR_RETURN(TpPlan tp, TpPlanFor(checkpoint, options, config, names));
  if (!options.expert_parallel) return tp;
  TpPlan ep;
  if (!options.ep_plan_json.empty()) {
    auto given = TpPlan::FromJson(options.ep_plan_json);
    if (!given.ok()) return given.status().WithContext("the expert-parallel plan given");
    ep = std::move(*given);
  } else if (config.empty()) {
    return Status::NotFound(
        "the checkpoint has no config.json to take an expert-parallel plan from: give one "
        "(--ep-plan FILE.json, ParallelOptions::ep_plan_json)");
  } else {
    auto from_config = planning::EpPlanFromConfig(config, names);
    if (!from_config.ok()) return from_config.status().WithContext(checkpoint.config().path);
    ep = std::move(*from_config);
  }
  if (ep.empty()) {  // transformers refuses it too: ep_size > 1 with no ep plan
    return Status::InvalidArgument(
        "the expert-parallel plan is empty, so --ep would split nothing: give one that names "
        "the experts (grouped_gemm), or load without --ep");
  }
  return planning::WithExpertPlan(tp, ep);
}

// Which tensors the rank's stage holds: the stage's layers, and a test of each name.
struct Stage {
  planning::PpModel model;
  std::vector<std::pair<int, int>> ranges;
  int stage = 0;
  bool Holds(std::string_view name) const {
    return ranges.size() <= 1 || planning::OnStage(name, model, ranges, stage);
  }
};

Result<Stage> StageOf(const Checkpoint& checkpoint, const ParallelOptions& options,
                      std::string_view config, std::span<const std::string> names) {
  Stage s;
  s.stage = (options.rank / options.tp) % options.pp;
  auto model = planning::PpModelOf(config, names);
  if (!model.ok()) return model.status().WithContext(checkpoint.config().path);
  s.model = *model;
  LOADSTONE_ASSIGN_OR_RETURN(s.ranges,
                             planning::PpLayerRanges(s.model.layers, options.pp,
                                                     options.pp_layers));
  return s;
}

// Elements [first, end) of a plain tensor, as a 1-D tensor of the view.
TensorInfo ElementsOf(const TensorInfo& t, uint64_t first, uint64_t end) {
  TensorInfo part = t;
  const uint64_t elem = static_cast<uint64_t>(DTypeBits(t.dtype)) / 8;
  part.shape = {end - first};
  part.offset += first * elem;
  part.nbytes = (end - first) * elem;
  return part;
}

Status CheckSplittable(const Checkpoint& checkpoint, const TensorInfo& t, std::string_view style) {
  std::string_view why;
  if (t.packed) {
    why = "it is packed (quantized blocks)";
  } else if (checkpoint.Dequantizes(t)) {
    why = "it is a float8 weight with scales";
  } else if (DTypeBits(t.dtype) % 8 != 0) {
    why = "its elements are narrower than a byte";
  } else if (!t.plain_layout()) {
    why = "its file bytes are not contiguous little-endian (a strided or big-endian archive "
          "tensor)";
  }
  if (why.empty()) return Status::OK();
  return Status::Unsupported(fmt::format(
      "tensor '{}': its tensor-parallel rule '{}' splits it, and loadstone does not split a "
      "tensor when {} yet; load it with --tp 1 or give a plan that replicates it",
      t.name, style, why));
}

// The split of `t` under `style` across the group, and the part of it rank `me` reads.
Result<TensorShard> ShardOf(const Checkpoint& checkpoint, const TensorInfo& t,
                            planning::TpStyle style, int me, int tp,
                            std::vector<TensorInfo>& reads) {
  const std::string style_name(planning::TpStyleName(style));
  TensorShard shard{t.name, style_name, t.shape, t.shape};
  const std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
  bool contiguous = true;
  for (int r = 0; r < tp; ++r) {
    auto part = planning::TpPartOf(style, t.name, shape, r, tp);
    if (!part.ok()) return part.status();
    contiguous = contiguous && part->runs.size() <= 1;
    if (r == me) shard.shape = part->shape;
    shard.dim = part->dim;
    shard.cuts.push_back(std::move(part->intervals));
  }
  if (shard.dim < 0) {  // the style leaves it whole (a row-wise bias, a 1-D packed_rowwise)
    shard.style.clear();
    shard.cuts.clear();
    reads.push_back(t);
    return shard;
  }
  LOADSTONE_RETURN_IF_ERROR(CheckSplittable(checkpoint, t, style_name));
  if (contiguous) {  // one run each: the part's first element and its shape say where it is
    auto part = planning::TpPartOf(style, t.name, shape, me, tp);
    if (!part.ok()) return part.status();
    // An empty part (torch.chunk left this rank nothing) is planned as a tensor of no bytes,
    // so that it gets the dtype the load gives the others.
    const uint64_t elem = static_cast<uint64_t>(DTypeBits(t.dtype)) / 8;
    TensorInfo read = t;
    read.shape = shard.shape;
    if (!part->runs.empty()) {
      read.offset += part->runs[0].first * elem;
      read.nbytes = part->runs[0].count * elem;
    } else {
      read.nbytes = 0;
    }
    reads.push_back(std::move(read));
    return shard;
  }
  if (t.numel() < static_cast<uint64_t>(tp)) {
    return Status::Unsupported(fmt::format(
        "tensor '{}': its rule '{}' splits {} elements over {} ranks, fewer than one each to "
        "read; give a plan that replicates it",
        t.name, style_name, t.numel(), tp));
  }
  shard.exchanged = true;
  const uint64_t n = t.numel();
  const auto w = static_cast<uint64_t>(tp);
  for (uint64_t r = 0; r < w; ++r) shard.blocks.emplace_back(n * r / w, n * (r + 1) / w);
  reads.push_back(ElementsOf(t, shard.blocks[me].first, shard.blocks[me].second));
  return shard;
}

// The tensors a load must see whole, beside their weight: quantized weights, float8 weights
// with scales, and their quant state and scales.
std::unordered_set<std::string> QuantTensors(const Checkpoint& checkpoint) {
  std::unordered_set<std::string> out;
  for (const TensorInfo& t : checkpoint.tensors()) {
    if (!t.packed && !checkpoint.Dequantizes(t)) continue;
    out.insert(t.name);
    auto companions = checkpoint.Companions(t);
    if (!companions.ok()) continue;
    for (const TensorInfo* c : *companions) out.insert(c->name);
  }
  return out;
}

// ReadMode::kOnce: the group's rank 0 reads all of `t` as a block, the others none of it, and the
// exchange gives every rank its part (a replicated tensor: all of it along dim 0). Scalars, empty
// tensors and tensors that are not plain elements or belong to a quantized weight (`quant`: never
// split, ShardOf refuses that) are read by every rank.
void ReadOnce(const TensorInfo& t, bool quant, TensorShard& shard, int me, int tp,
              std::vector<TensorInfo>& reads) {
  const uint64_t n = t.numel();
  if (tp == 1 || t.shape.empty() || n == 0 || quant || t.packed ||
      DTypeBits(t.dtype) % 8 != 0 || !t.plain_layout()) {
    reads.push_back(t);
    return;
  }
  if (shard.dim < 0) {
    shard.dim = 0;
    shard.cuts.assign(static_cast<size_t>(tp), {{0, t.shape[0]}});
  }
  shard.exchanged = true;
  shard.blocks.assign(static_cast<size_t>(tp), {0, 0});
  shard.blocks[0] = {0, n};
  reads.push_back(ElementsOf(t, 0, me == 0 ? n : 0));
}

// Adds tensor `t` of the rank's stage, under `style` (none: replicated), to its share and reads.
Status AddTensor(const Checkpoint& checkpoint, const TensorInfo& t,
                 std::optional<planning::TpStyle> style, bool quant, RankShare& share,
                 std::vector<TensorInfo>& reads) {
  const bool once = share.read_mode == ReadMode::kOnce;
  const int tp = share.options.tp;
  std::vector<TensorInfo> unused;  // kOnce: the reads ShardOf would give the rank
  TensorShard shard{t.name, "", t.shape, t.shape};
  if (style && *style != planning::TpStyle::kReplicate) {
    auto split = ShardOf(checkpoint, t, *style, share.tp_rank, tp, once ? unused : reads);
    if (!split.ok()) return split.status();
    shard = std::move(*split);
  } else if (!once) {
    reads.push_back(t);
  }
  (shard.dim < 0 ? share.replicated_bytes : share.split_bytes) += t.nbytes;
  if (once) ReadOnce(t, quant, shard, share.tp_rank, tp, reads);
  if (shard.exchanged) share.exchanged_bytes += t.nbytes;
  share.tensors.push_back(std::move(shard));
  return Status::OK();
}

}  // namespace

std::string_view ReadModeName(ReadMode mode) {
  switch (mode) {
    case ReadMode::kEachRank: return "each";
    case ReadMode::kOnce: return "once";
    case ReadMode::kAuto: return "auto";
  }
  return "?";
}

ReadModeCost EstimateReadModes(const RankShare& each, double read_bytes_per_s,
                               double link_bytes_per_s) {
  const double tp = each.options.tp;
  const double split = static_cast<double>(each.split_bytes);
  const double replicated = static_cast<double>(each.replicated_bytes);
  const double read = std::max(read_bytes_per_s, 1.0);
  const double link = std::max(link_bytes_per_s, 1.0);
  ReadModeCost cost;
  // Each rank: the group reads the split tensors once and the replicated ones tp times; a rank
  // receives the others' share of its part of each exchanged tensor.
  cost.each_seconds = (split + tp * replicated) / read +
                      static_cast<double>(each.exchanged_bytes) / tp * (tp - 1) / tp / link;
  // Once: the stage read once; its first rank sends the others their parts of the split tensors
  // (but one expert's tensors, which their own rank reads) and the replicated ones whole.
  const double sent = split - static_cast<double>(each.expert_bytes);
  cost.once_seconds =
      (split + replicated) / read + (sent * (tp - 1) / tp + replicated * (tp - 1)) / link;
  return cost;
}

PlanOptions RankPlanOptions(PlanOptions options) {
  options.coalesce_gap = 0;
  return options;
}

Result<RankShare> ShareOf(const Checkpoint& checkpoint, const ParallelOptions& options) {
  LOADSTONE_RETURN_IF_ERROR(CheckOptions(options));
  if (options.read_mode == ReadMode::kAuto) {
    return Status::InvalidArgument(
        "ReadMode::kAuto is chosen by LoadRank from measured bandwidths (ChooseReadMode): give "
        "ShareOf kEachRank or kOnce");
  }
  RankShare share{options, options.rank % options.tp, options.rank / options.tp, 0, {},
                  ReadMode::kEachRank, checkpoint};
  std::vector<std::string> names;
  names.reserve(checkpoint.tensors().size());
  for (const TensorInfo& t : checkpoint.tensors()) names.push_back(t.name);
  std::string config;
  if (options.pp > 1 || (options.tp > 1 && options.tp_plan_json.empty()) ||
      (options.expert_parallel && options.ep_plan_json.empty())) {
    LOADSTONE_ASSIGN_OR_RETURN(config, ConfigText(checkpoint));
  }
  TpPlan plan;
  if (options.tp > 1) {
    LOADSTONE_ASSIGN_OR_RETURN(plan, PlanFor(checkpoint, options, config, names));
  }
  Stage stage;
  if (options.pp > 1) {
    LOADSTONE_ASSIGN_OR_RETURN(stage, StageOf(checkpoint, options, config, names));
    share.stage = stage.stage;
    share.layers = stage.ranges[static_cast<size_t>(stage.stage)];
  }
  const bool once = options.read_mode == ReadMode::kOnce;
  share.read_mode = once ? ReadMode::kOnce : ReadMode::kEachRank;
  planning::ExpertOwners experts;
  if (options.expert_parallel) {
    LOADSTONE_ASSIGN_OR_RETURN(experts, planning::ExpertOwners::Of(names, plan, options.tp));
  }
  std::vector<TensorInfo> reads;
  const std::unordered_set<std::string> quant =
      once ? QuantTensors(checkpoint) : std::unordered_set<std::string>();
  for (const TensorInfo& t : checkpoint.tensors()) {
    if (!stage.Holds(t.name)) continue;
    // One expert's tensor: held whole, and read, by the rank of that expert only.
    if (const std::optional<int> owner = experts.OwnerOf(t.name)) {
      share.split_bytes += t.nbytes;
      share.expert_bytes += t.nbytes;
      if (*owner != share.tp_rank) {
        share.elsewhere.push_back(t.name);
        continue;
      }
      share.tensors.push_back({t.name, "grouped_gemm", t.shape, t.shape});
      reads.push_back(t);
      continue;
    }
    LOADSTONE_RETURN_IF_ERROR(AddTensor(checkpoint, t, plan.Lookup(t.name),
                                        quant.count(t.name) > 0, share, reads));
  }
  for (const TensorInfo& t : reads) share.read_bytes += t.nbytes;
  auto view = checkpoint.WithTensors(std::move(reads));
  if (!view.ok()) return view.status().WithContext("a tensor-parallel rank's reads");
  share.reads = std::move(*view);
  return share;
}

}  // namespace loadstone
