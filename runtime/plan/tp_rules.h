// Tensor-parallel sharding rules as Hugging Face transformers (5.25) applies them: a model's plan
// (`base_model_tp_plan` keys relative to the base model, the embeddings' default, the head's
// plan), each parameter's style found as transformers finds it, and the part of each tensor that
// rank r of W holds — as element runs of the full row-major tensor, what a rank must read. The
// reference is transformers itself: tests/fixtures/make_tp_fixtures.py records, for small models,
// what its loader cuts out for every rank (tests/fixtures/tp/cases.json). Pure functions.
#ifndef LOADSTONE_RUNTIME_PLAN_TP_RULES_H_
#define LOADSTONE_RUNTIME_PLAN_TP_RULES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstone/status.h"

namespace loadstone::planning {

// What a style does to one parameter (transformers' `shard_param` of the style's class).
enum class TpStyle : uint8_t {
  kReplicate,         // every rank holds all of it
  kColwise,           // colwise, colwise_rep, colwise_gather_output: dim ndim-2 (1-D: dim 0)
  kRowwise,           // rowwise, rowwise_rep, rowwise_split_input: the last dim; a `bias`: whole
  kEmbeddingRowwise,  // embedding_rowwise: dim 0
  kEmbeddingColwise,  // embedding_colwise: dim 1
  kPackedColwise,     // packed_colwise: dim ndim-2 in two halves, each chunked (1-D: dim 0)
  kPackedRowwise,     // packed_rowwise: the last dim (as transformers' loader cuts it); 1-D: whole
  kGroupedGemm,       // grouped_gemm (expert parallelism): dim 0, the experts, split evenly
};

// transformers' style name → what it does. Errors: InvalidArgument naming the style and the
// vocabulary for an unknown one; Unsupported for styles that need more than the plan
// (unit_colwise / unit_rowwise: the head size).
Result<TpStyle> ParseTpStyle(std::string_view name);
std::string_view TpStyleName(TpStyle style);

// transformers' replace_layer_number_by_wildcard: each ".<digits>" followed by "." or the end
// becomes ".*" ("model.layers.3.mlp" → "model.layers.*.mlp"; "a.0.1.b" → "a.*.1.b").
std::string WildcardName(std::string_view name);

// An ordered plan: wildcard module or parameter names → styles.
class TpPlan {
 public:
  // A JSON object {"model.layers.*.self_attn.q_proj": "colwise", ...}, keys as given.
  // Errors: InvalidArgument (not an object of strings, an unknown style, a key twice).
  static Result<TpPlan> FromJson(std::string_view json);
  // A causal LM's plan as transformers merges it: the head's own ("lm_head" →
  // colwise_gather_output), then, when `base` is not empty, "embed_tokens" (the base's style
  // when it names it, else embedding_rowwise when the embeddings are an nn.Embedding), then the
  // rest of `base` (config's base_model_tp_plan); the base keys prefixed with `base_prefix`
  // ("model." when the names have it, else "").
  static Result<TpPlan> ForCausalLm(const TpPlan& base, std::string_view base_prefix,
                                    bool embeddings_are_embedding);

  Status Add(std::string key, TpStyle style);
  const std::vector<std::pair<std::string, TpStyle>>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }

  // The style of parameter `name` (full name, e.g. "model.layers.0.mlp.up_proj.weight"): the
  // entry for its wildcard name, else the entry for its immediate module; none otherwise.
  std::optional<TpStyle> Lookup(std::string_view name) const;

 private:
  const TpStyle* Find(std::string_view key) const;
  std::vector<std::pair<std::string, TpStyle>> entries_;
};

// The built-in `base_model_tp_plan` of a transformers model type ("llama", "qwen2", "qwen3",
// ...) when its config.json does not carry one; none for a type loadstone does not know.
std::optional<TpPlan> DefaultBaseTpPlan(std::string_view model_type);

// The plan transformers uses for a causal LM whose config.json is `config_json` and whose tensors
// are named `names`: the config's `base_model_tp_plan` when it has one (it replaces the model
// type's), else DefaultBaseTpPlan of its model_type; the base keys under "model." when the
// tensors' names are; merged as ForCausalLm (embeddings: "model.embed_tokens.weight" present).
// Errors: InvalidArgument (config.json not an object, a bad plan in it), NotFound (no plan known
// for the model type: the message says to give one).
Result<TpPlan> TpPlanFromConfig(std::string_view config_json, std::span<const std::string> names);

// A base-model plan: config.json's `key` (base_model_tp_plan, base_model_ep_plan) or, when it
// has none, `known(model_type)`; `prefix` "model." when the tensors' names are under it. Errors:
// InvalidArgument (config.json not an object, a bad plan in it), NotFound naming `what` plan and
// the `flag` that gives one.
struct BasePlan {
  TpPlan plan;
  std::string prefix;
};
Result<BasePlan> BasePlanOf(std::string_view config_json, std::span<const std::string> names,
                            std::string_view key,
                            std::optional<TpPlan> (*known)(std::string_view), std::string_view what,
                            std::string_view flag);

// torch.chunk's part `rank` of `world` of a dimension of `n`: [first, end), empty past the end.
std::pair<uint64_t, uint64_t> ChunkOf(uint64_t n, int rank, int world);

// One run of a rank's part of a tensor: `count` consecutive elements from element `first` of the
// full tensor (row-major).
struct ElementRun {
  uint64_t first = 0;
  uint64_t count = 0;
  friend bool operator==(const ElementRun&, const ElementRun&) = default;
};

// What rank `rank` of `world` holds of a parameter: its shape there and its elements, as runs of
// the full tensor's (row-major) elements in increasing order, adjacent runs merged — the whole
// tensor when replicated.
struct TpPart {
  std::vector<uint64_t> shape;
  std::vector<ElementRun> runs;
  // The split dimension (-1: whole) and the intervals of it the rank holds, in order: the part is,
  // for each index of the dimensions before `dim`, those intervals.
  int dim = -1;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
};

// Rank `rank` of `world`'s part of parameter `name` (its last name component decides "bias") of
// `shape` under `style`. Errors: as TpElementRuns.
Result<TpPart> TpPartOf(TpStyle style, std::string_view name, std::span<const int64_t> shape,
                        int rank, int world);

// The elements rank `rank` of `world` holds of parameter `name` (its last name component decides
// "bias") of `shape` under `style`, as runs in increasing order, adjacent runs merged; the whole
// tensor when replicated. Errors: InvalidArgument naming the parameter for a rank or world out of
// range, a style that does not fit the shape (embedding_colwise of a 1-D tensor), or a packed
// split transformers cannot load (its dimension not a multiple of 2 × world).
Result<std::vector<ElementRun>> TpElementRuns(TpStyle style, std::string_view name,
                                              std::span<const int64_t> shape, int rank,
                                              int world);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_TP_RULES_H_
