#include "runtime/plan/tp_rules.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace loadstone::planning {
namespace {

struct StyleName {
  std::string_view name;
  TpStyle style;
};

// transformers 5.25's ALL_PARALLEL_STYLES (distributed/tensor_parallel.py), by what each does to
// a parameter's bytes. The replicated ones differ only in their forward hooks.
constexpr std::array<StyleName, 19> kStyles = {{
    {"colwise", TpStyle::kColwise},
    {"colwise_rep", TpStyle::kColwise},
    {"colwise_gather_output", TpStyle::kColwise},
    {"rowwise", TpStyle::kRowwise},
    {"rowwise_rep", TpStyle::kRowwise},
    {"rowwise_split_input", TpStyle::kRowwise},
    {"embedding_rowwise", TpStyle::kEmbeddingRowwise},
    {"embedding_colwise", TpStyle::kEmbeddingColwise},
    {"packed_colwise", TpStyle::kPackedColwise},
    {"packed_rowwise", TpStyle::kPackedRowwise},
    {"replicate", TpStyle::kReplicate},
    {"sequence_parallel", TpStyle::kReplicate},
    {"replicated_with_grad_allreduce", TpStyle::kReplicate},
    {"mla_kv_a_proj", TpStyle::kReplicate},
    {"all_reduce", TpStyle::kReplicate},
    {"moe_tp_experts", TpStyle::kReplicate},
    {"local_params", TpStyle::kReplicate},
    {"ep_dispatch_experts", TpStyle::kReplicate},
    {"grouped_gemm", TpStyle::kGroupedGemm},
}};

std::string_view LastComponent(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

// The dimension a style cuts and its intervals along it; dim -1: the whole tensor.
struct Cut {
  int dim = -1;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
};

Result<Cut> CutOf(TpStyle style, std::string_view name, std::span<const int64_t> shape, int rank,
                  int world) {
  const int ndim = static_cast<int>(shape.size());
  auto chunk = [&](int dim) {
    return Cut{dim, {ChunkOf(static_cast<uint64_t>(shape[dim]), rank, world)}};
  };
  auto refuse = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' (shape [{}]) cannot be split {}: {}; give it another style in the tensor-"
        "parallel plan (replicate keeps it whole)",
        name, fmt::join(shape, ", "), TpStyleName(style), why));
  };
  if (style == TpStyle::kReplicate) return Cut{};
  if (ndim == 0) return refuse("it is a scalar");
  switch (style) {
    case TpStyle::kReplicate: break;
    case TpStyle::kColwise: return chunk(ndim >= 2 ? ndim - 2 : 0);
    case TpStyle::kRowwise:
      if (LastComponent(name) == "bias") return Cut{};
      return chunk(ndim - 1);
    case TpStyle::kEmbeddingRowwise: return chunk(0);
    case TpStyle::kEmbeddingColwise:
      if (ndim < 2) return refuse("it has no dimension 1");
      return chunk(1);
    case TpStyle::kPackedColwise:
    case TpStyle::kPackedRowwise: {
      const bool col = style == TpStyle::kPackedColwise;
      if (ndim == 1) return col ? chunk(0) : Cut{};
      const int dim = col ? ndim - 2 : ndim - 1;
      const uint64_t n = static_cast<uint64_t>(shape[dim]);
      if (n % (2 * static_cast<uint64_t>(world)) != 0) {
        return refuse(fmt::format("its packed dimension {} ({}) is not a multiple of 2 × {} ranks "
                                  "(transformers cannot load such a split either)",
                                  dim, n, world));
      }
      if (!col) return chunk(dim);  // as transformers' loader cuts a _StridedShard of dim -1
      const uint64_t half = n / 2;
      const auto [lo, hi] = ChunkOf(half, rank, world);
      return Cut{dim, {{lo, hi}, {half + lo, half + hi}}};
    }
    case TpStyle::kGroupedGemm:
      if (static_cast<uint64_t>(shape[0]) % static_cast<uint64_t>(world) != 0) {
        return refuse(fmt::format("its {} experts (dim 0) do not split evenly over {} ranks "
                                  "(transformers refuses it too)",
                                  shape[0], world));
      }
      return chunk(0);
  }
  return Cut{};
}

}  // namespace

Result<TpStyle> ParseTpStyle(std::string_view name) {
  for (const StyleName& s : kStyles) {
    if (s.name == name) return s.style;
  }
  if (name == "unit_colwise" || name == "unit_rowwise") {
    return Status::Unsupported(fmt::format(
        "tensor-parallel style '{}' is not supported yet (it splits by attention heads); use "
        "colwise / rowwise / replicate for those modules",
        name));
  }
  std::vector<std::string_view> names;
  for (const StyleName& s : kStyles) names.push_back(s.name);
  return Status::InvalidArgument(fmt::format("unknown tensor-parallel style '{}' (known: {})",
                                             name, fmt::join(names, ", ")));
}

std::string_view TpStyleName(TpStyle style) {
  for (const StyleName& s : kStyles) {
    if (s.style == style) return s.name;
  }
  return "replicate";
}

std::string WildcardName(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  size_t i = 0;
  while (i < name.size()) {
    if (name[i] == '.') {
      size_t j = i + 1;
      while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
      if (j > i + 1 && (j == name.size() || name[j] == '.')) {
        // The "." after the digits is part of the match (re.sub's group 1), so it cannot start
        // the next one: "a.0.1.b" → "a.*.1.b", as transformers gives.
        out += j == name.size() ? ".*" : ".*.";
        i = std::min(j + 1, name.size());
        continue;
      }
    }
    out += name[i++];
  }
  return out;
}

Result<TpPlan> TpPlan::FromJson(std::string_view json) {
  const auto doc = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument(
        "a tensor-parallel plan is a JSON object of module names to styles, e.g. "
        R"({"layers.*.self_attn.q_proj": "colwise"})");
  }
  TpPlan plan;
  for (const auto& [key, value] : doc.items()) {
    if (!value.is_string()) {
      return Status::InvalidArgument(
          fmt::format("tensor-parallel plan entry '{}' is not a style name (a string)", key));
    }
    LOADSTONE_ASSIGN_OR_RETURN(const TpStyle style, ParseTpStyle(value.get<std::string>()));
    LOADSTONE_RETURN_IF_ERROR(plan.Add(key, style));
  }
  return plan;
}

Result<TpPlan> TpPlan::ForCausalLm(const TpPlan& base, std::string_view base_prefix,
                                   bool embeddings_are_embedding) {
  TpPlan out;
  LOADSTONE_RETURN_IF_ERROR(out.Add("lm_head", TpStyle::kColwise));  // colwise_gather_output
  // {"embed_tokens": "embedding_rowwise", **base}: first, with the base's style if it names it.
  const TpStyle* named = base.Find("embed_tokens");
  if (!base.empty() && (embeddings_are_embedding || named)) {
    LOADSTONE_RETURN_IF_ERROR(out.Add(fmt::format("{}embed_tokens", base_prefix),
                                      named ? *named : TpStyle::kEmbeddingRowwise));
  }
  for (const auto& [key, style] : base.entries()) {
    if (key == "embed_tokens") continue;
    LOADSTONE_RETURN_IF_ERROR(out.Add(fmt::format("{}{}", base_prefix, key), style));
  }
  return out;
}

Status TpPlan::Add(std::string key, TpStyle style) {
  if (Find(key)) {
    return Status::InvalidArgument(fmt::format("tensor-parallel plan names '{}' twice", key));
  }
  entries_.emplace_back(std::move(key), style);
  return Status::OK();
}

const TpStyle* TpPlan::Find(std::string_view key) const {
  for (const auto& [k, style] : entries_) {
    if (k == key) return &style;
  }
  return nullptr;
}

std::optional<TpStyle> TpPlan::Lookup(std::string_view name) const {
  const std::string generic = WildcardName(name);
  if (const TpStyle* s = Find(generic)) return *s;
  const size_t dot = generic.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  if (const TpStyle* s = Find(std::string_view(generic).substr(0, dot))) return *s;
  return std::nullopt;
}

Result<BasePlan> BasePlanOf(std::string_view config_json, std::span<const std::string> names,
                            std::string_view key,
                            std::optional<TpPlan> (*known)(std::string_view), std::string_view what,
                            std::string_view flag) {
  const auto config = nlohmann::ordered_json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return Status::InvalidArgument("config.json is not a JSON object");
  }
  const std::string type = config.value("model_type", std::string());
  BasePlan out;
  if (auto given = config.find(key); given != config.end() && !given->is_null()) {
    auto parsed = TpPlan::FromJson(given->dump());
    if (!parsed.ok()) return parsed.status().WithContext(fmt::format("config.json's {}", key));
    out.plan = std::move(*parsed);
  } else if (auto plan = known(type)) {
    out.plan = std::move(*plan);
  } else {
    return Status::NotFound(fmt::format(
        "no {} plan is known for model type '{}' (config.json has no {}); give one with {} "
        "FILE.json",
        what, type, key, flag));
  }
  const bool prefixed = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.starts_with("model.");
  });
  out.prefix = prefixed ? "model." : "";
  return out;
}

Result<TpPlan> TpPlanFromConfig(std::string_view config_json,
                                std::span<const std::string> names) {
  LOADSTONE_ASSIGN_OR_RETURN(BasePlan base_plan,
                             BasePlanOf(config_json, names, "base_model_tp_plan",
                                        &DefaultBaseTpPlan, "tensor-parallel", "--tp-plan"));
  const TpPlan& base = base_plan.plan;
  const std::string& prefix = base_plan.prefix;
  const std::string embeddings = prefix + "embed_tokens.weight";
  const bool embedding = std::find(names.begin(), names.end(), embeddings) != names.end();
  return TpPlan::ForCausalLm(base, prefix, embedding);
}

std::optional<TpPlan> DefaultBaseTpPlan(std::string_view model_type) {
  // transformers 5.25's configs. Its MoE models' dense MLP entries stay (they name the dense
  // layers' MLP, e.g. Qwen-MoE's mlp_only_layers); Mixtral splits attention only; gpt-oss the
  // embeddings only.
  TpPlan plan;
  if (model_type == "gpt_oss") {
    (void)plan.Add("embed_tokens", TpStyle::kEmbeddingRowwise);
    return plan;
  }
  const bool qwen3 = model_type == "qwen3" || model_type == "qwen3_moe";
  const bool mlp = qwen3 || model_type == "llama" || model_type == "qwen2" ||
                   model_type == "qwen2_moe";
  if (!mlp && model_type != "mixtral") return std::nullopt;
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    (void)plan.Add(fmt::format("layers.*.self_attn.{}", p), TpStyle::kColwise);
  }
  if (qwen3) {  // replicated_with_grad_allreduce
    (void)plan.Add("layers.*.self_attn.q_norm", TpStyle::kReplicate);
    (void)plan.Add("layers.*.self_attn.k_norm", TpStyle::kReplicate);
  }
  (void)plan.Add("layers.*.self_attn.o_proj", TpStyle::kRowwise);
  if (!mlp) return plan;
  (void)plan.Add("layers.*.mlp.gate_proj", TpStyle::kColwise);
  (void)plan.Add("layers.*.mlp.up_proj", TpStyle::kColwise);
  (void)plan.Add("layers.*.mlp.down_proj", TpStyle::kRowwise);
  return plan;
}

std::pair<uint64_t, uint64_t> ChunkOf(uint64_t n, int rank, int world) {
  const uint64_t w = static_cast<uint64_t>(world);
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t size = (n + w - 1) / w;  // torch.chunk: ceil(n / world) each, the last ones less
  return {std::min(r * size, n), std::min((r + 1) * size, n)};
}

Result<TpPart> TpPartOf(TpStyle style, std::string_view name, std::span<const int64_t> shape,
                        int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': rank {} of a world of {} (a rank is 0 .. world size - 1)", name, rank,
        world));
  }
  LOADSTONE_ASSIGN_OR_RETURN(const Cut cut, CutOf(style, name, shape, rank, world));
  TpPart part;
  uint64_t numel = 1;
  for (int64_t d : shape) {
    numel *= static_cast<uint64_t>(d);
    part.shape.push_back(static_cast<uint64_t>(d));
  }
  auto add = [&runs = part.runs](uint64_t first, uint64_t count) {
    if (count == 0) return;
    if (!runs.empty() && runs.back().first + runs.back().count == first) {
      runs.back().count += count;
    } else {
      runs.push_back({first, count});
    }
  };
  if (cut.dim < 0) {
    add(0, numel);
    return part;
  }
  uint64_t outer = 1;
  uint64_t inner = 1;
  for (int d = 0; d < cut.dim; ++d) outer *= static_cast<uint64_t>(shape[d]);
  for (size_t d = cut.dim + 1; d < shape.size(); ++d) inner *= static_cast<uint64_t>(shape[d]);
  const uint64_t along = static_cast<uint64_t>(shape[cut.dim]);
  part.dim = cut.dim;
  part.intervals = cut.intervals;
  part.shape[cut.dim] = 0;
  for (const auto& [lo, hi] : cut.intervals) part.shape[cut.dim] += hi - lo;
  for (uint64_t o = 0; o < outer; ++o) {
    for (const auto& [lo, hi] : cut.intervals) add((o * along + lo) * inner, (hi - lo) * inner);
  }
  return part;
}

Result<std::vector<ElementRun>> TpElementRuns(TpStyle style, std::string_view name,
                                              std::span<const int64_t> shape, int rank,
                                              int world) {
  LOADSTONE_ASSIGN_OR_RETURN(TpPart part, TpPartOf(style, name, shape, rank, world));
  return std::move(part.runs);
}

}  // namespace loadstone::planning
