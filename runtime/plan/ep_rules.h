// Expert parallelism as Hugging Face transformers (5.25) applies it with ep_size = tp_size
// (DistributedConfig(tp_size=T, ep_size=T)): the model's ep plan over its tp plan, grouped_gemm
// on the stacked experts (tp_rules.h), and — for checkpoints that store one tensor per expert —
// which rank of a group holds each expert: experts [r·E/tp, (r+1)·E/tp) on rank r, whole. The reference
// is transformers itself: tests/fixtures/make_ep_fixtures.py records what its from_pretrained
// loads on each rank (tests/fixtures/tp/ep_cases.json). Pure functions.
#ifndef LOADSTONE_RUNTIME_PLAN_EP_RULES_H_
#define LOADSTONE_RUNTIME_PLAN_EP_RULES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "loadstone/status.h"
#include "runtime/plan/tp_rules.h"

namespace loadstone::planning {

// The model's ep plan — config.json's base_model_ep_plan, else the model type's built-in one
// (DefaultBaseEpPlan), its keys under "model." as the tp plan's — over the tp plan, whose
// entries for a module of the ep plan or under one are dropped ("EP rules take precedence"). Errors: InvalidArgument (a bad plan), NotFound (no ep plan known for the type).
std::optional<TpPlan> DefaultBaseEpPlan(std::string_view model_type);
Result<TpPlan> EpPlanFromConfig(std::string_view config_json, std::span<const std::string> names);
Result<TpPlan> WithExpertPlan(const TpPlan& tp, const TpPlan& ep);

// A checkpoint tensor of one expert: "<experts>.<index>.<rest>", <experts> the module holding
// the experts ("model.layers.0.mlp.experts.3.gate_proj.weight" → "model.layers.0.mlp.experts",
// 3), as Qwen-MoE, Mixtral and DeepSeek checkpoints store them; none for any other name.
struct ExpertTensor {
  std::string experts;
  uint64_t index = 0;
  std::string module;  // the name's component after the index ("gate_proj")
};
std::optional<ExpertTensor> ExpertTensorOf(std::string_view name);

// Whether `plan` splits the experts of module `experts` ("model.layers.3.mlp.experts"): it gives
// grouped_gemm to one of its parameters ("model.layers.*.mlp.experts.gate_up_proj"). The module
// is matched under transformers' own name for it: Mixtral's checkpoints name it
// "block_sparse_moe.experts", transformers' model "mlp.experts" (its conversion mapping).
bool SplitsExperts(const TpPlan& plan, std::string_view experts);

// Whether `plan` splits one expert's tensor `e` by expert: the stacked parameter transformers
// merges it into (its conversion mapping: gate_proj, up_proj, Mixtral's w1, w3 → gate_up_proj;
// down_proj, w2 → down_proj) has grouped_gemm; for a module of another name, any parameter of the
// experts module has.
bool SplitsByExpert(const TpPlan& plan, const ExpertTensor& e);

// Which rank of a group of `tp` holds each expert, for the tensors among `names` that are one
// expert's and that `plan` splits by expert (SplitsByExpert).
class ExpertOwners {
 public:
  ExpertOwners() = default;
  // Errors: InvalidArgument naming the module when its experts are not 0 .. E-1 each stored or E
  // does not divide by tp (transformers: "Cannot evenly shard").
  static Result<ExpertOwners> Of(std::span<const std::string> names, const TpPlan& plan, int tp);
  // The rank holding tensor `name`'s expert; none when it is not one expert's tensor of a split
  // module.
  std::optional<int> OwnerOf(std::string_view name) const;

 private:
  std::unordered_map<std::string, int> owner_;  // each split expert tensor → its rank
};

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_EP_RULES_H_
