// Expert parallelism (ep_rules.h).
#include "runtime/plan/ep_rules.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace loadstone::planning {

std::optional<TpPlan> DefaultBaseEpPlan(std::string_view model_type) {
  // transformers 5.25's configs: the same plan for these; gpt-oss adds its experts' biases.
  constexpr std::array<std::string_view, 4> kSame = {"mixtral", "qwen2_moe", "qwen3_moe",
                                                     "deepseek_v3"};
  const bool gpt_oss = model_type == "gpt_oss";
  if (!gpt_oss && std::find(kSame.begin(), kSame.end(), model_type) == kSame.end()) {
    return std::nullopt;
  }
  TpPlan plan;
  (void)plan.Add("layers.*.mlp.experts.gate_up_proj", TpStyle::kGroupedGemm);
  if (gpt_oss) (void)plan.Add("layers.*.mlp.experts.gate_up_proj_bias", TpStyle::kGroupedGemm);
  (void)plan.Add("layers.*.mlp.experts.down_proj", TpStyle::kGroupedGemm);
  if (gpt_oss) (void)plan.Add("layers.*.mlp.experts.down_proj_bias", TpStyle::kGroupedGemm);
  (void)plan.Add("layers.*.mlp.experts", TpStyle::kReplicate);  // ep_dispatch_experts
  return plan;
}

Result<TpPlan> EpPlanFromConfig(std::string_view config_json,
                                std::span<const std::string> names) {
  LOADSTONE_ASSIGN_OR_RETURN(BasePlan base,
                             BasePlanOf(config_json, names, "base_model_ep_plan",
                                        &DefaultBaseEpPlan, "expert-parallel", "--ep-plan"));
  TpPlan out;
  for (const auto& [key, style] : base.plan.entries()) {
    LOADSTONE_RETURN_IF_ERROR(out.Add(base.prefix + key, style));
  }
  return out;
}

Result<TpPlan> WithExpertPlan(const TpPlan& tp, const TpPlan& ep) {
  TpPlan out;
  for (const auto& [key, style] : tp.entries()) {
    // transformers' `(?:ep keys)(?:\..+)?` fullmatch: an ep module itself or anything under it.
    const bool expert = std::any_of(ep.entries().begin(), ep.entries().end(), [&](const auto& e) {
      return key == e.first || (key.starts_with(e.first) && key.size() > e.first.size() + 1 &&
                                key[e.first.size()] == '.');
    });
    if (!expert) LOADSTONE_RETURN_IF_ERROR(out.Add(key, style));
  }
  for (const auto& [key, style] : ep.entries()) LOADSTONE_RETURN_IF_ERROR(out.Add(key, style));
  return out;
}

std::optional<ExpertTensor> ExpertTensorOf(std::string_view name) {
  constexpr std::string_view kExperts = "experts.";
  for (size_t at = name.rfind(kExperts); at != std::string_view::npos;
       at = at == 0 ? std::string_view::npos : name.rfind(kExperts, at - 1)) {
    if (at > 0 && name[at - 1] != '.') continue;
    size_t i = at + kExperts.size();
    uint64_t index = 0;
    const size_t digits = i;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && i - digits < 9) {
      index = index * 10 + static_cast<uint64_t>(name[i++] - '0');
    }
    if (i == digits || i >= name.size() || name[i] != '.') continue;
    if (name[digits] == '0' && i - digits > 1) continue;  // "01": not how an index is written
    const std::string_view rest = name.substr(i + 1);
    return ExpertTensor{std::string(name.substr(0, at + kExperts.size() - 1)), index,
                        std::string(rest.substr(0, rest.find('.')))};
  }
  return std::nullopt;
}

namespace {

// An experts module under transformers' name for it (Mixtral's WeightRenaming
// ".block_sparse_moe." → ".mlp."), layer numbers as wildcards.
std::string TransformersExperts(std::string_view experts) {
  std::string name = WildcardName(experts);
  constexpr std::string_view kMixtral = ".block_sparse_moe.";
  if (const size_t at = name.find(kMixtral); at != std::string::npos) {
    name.replace(at, kMixtral.size(), ".mlp.");
  }
  return name;
}

}  // namespace

bool SplitsExperts(const TpPlan& plan, std::string_view experts) {
  const std::string prefix = TransformersExperts(experts) + '.';
  return std::any_of(plan.entries().begin(), plan.entries().end(), [&](const auto& entry) {
    return entry.second == TpStyle::kGroupedGemm && entry.first.starts_with(prefix);
  });
}

bool SplitsByExpert(const TpPlan& plan, const ExpertTensor& e) {
  std::string_view fused;
  for (std::string_view m : {"gate_proj", "up_proj", "w1", "w3"}) {
    if (e.module == m) fused = "gate_up_proj";
  }
  if (e.module == "down_proj" || e.module == "w2") fused = "down_proj";
  if (fused.empty()) return SplitsExperts(plan, e.experts);
  return plan.Lookup(TransformersExperts(e.experts) + '.' + std::string(fused)) ==
         TpStyle::kGroupedGemm;
}

Result<ExpertOwners> ExpertOwners::Of(std::span<const std::string> names, const TpPlan& plan,
                                      int tp) {
  std::unordered_map<std::string, std::unordered_set<uint64_t>> seen;
  std::vector<std::pair<const std::string*, ExpertTensor>> split;  // the names it splits
  for (const std::string& name : names) {
    auto expert = ExpertTensorOf(name);
    if (!expert || !SplitsByExpert(plan, *expert)) continue;
    seen[expert->experts].insert(expert->index);
    split.emplace_back(&name, std::move(*expert));
  }
  std::unordered_map<std::string, uint64_t> per_rank;  // experts module → experts a rank holds
  for (const auto& [module, indices] : seen) {
    const uint64_t n = indices.size();
    const uint64_t top = *std::max_element(indices.begin(), indices.end());
    if (top + 1 != n) {
      return Status::InvalidArgument(fmt::format(
          "'{}' has tensors of {} experts numbered up to {}: expert parallelism needs experts "
          "0 .. E-1 each stored; load it without --ep",
          module, n, top));
    }
    if (tp < 1 || n % static_cast<uint64_t>(tp) != 0) {
      return Status::InvalidArgument(fmt::format(
          "'{}' has {} experts, which do not split evenly over {} expert-parallel ranks "
          "(transformers refuses it too); give a --tp that divides {}, or load without --ep",
          module, n, tp, n));
    }
    per_rank.emplace(module, n / static_cast<uint64_t>(tp));
  }
  ExpertOwners out;
  for (const auto& [name, expert] : split) {
    out.owner_.emplace(*name, static_cast<int>(expert.index / per_rank.at(expert.experts)));
  }
  return out;
}

std::optional<int> ExpertOwners::OwnerOf(std::string_view name) const {
  const auto it = owner_.find(std::string(name));
  if (it == owner_.end()) return std::nullopt;
  return it->second;
}

}  // namespace loadstone::planning
