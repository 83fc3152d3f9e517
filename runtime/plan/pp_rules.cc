// Pipeline-parallel stages (pp_rules.h).
#include "runtime/plan/pp_rules.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace loadstone::planning {

Result<std::vector<std::pair<int, int>>> PpLayerRanges(int layers, int pp,
                                                       std::span<const int> counts) {
  if (pp < 1 || layers < 0) {
    return Status::InvalidArgument(fmt::format(
        "{} pipeline stages of {} layers: give at least one stage", pp, layers));
  }
  std::vector<int> per(static_cast<size_t>(pp), layers / pp);
  if (!counts.empty()) {
    const bool negative = std::any_of(counts.begin(), counts.end(), [](int c) { return c < 0; });
    long sum = 0;
    for (int c : counts) sum += c;
    if (counts.size() != per.size() || negative || sum != layers) {
      return Status::InvalidArgument(fmt::format(
          "layers per stage {} do not fit {} stages of a stack of {} layers: give one count per "
          "stage (--pp-layers), adding up to {}",
          fmt::join(counts, ","), pp, layers, layers));
    }
    per.assign(counts.begin(), counts.end());
  } else {
    // The remainder goes one each to stage pp-2, pp-3, ...: the last stage holds the final norm
    // and the head already, the first the embeddings (vLLM's rule).
    const int rest = layers % pp;
    for (int i = 2; i < rest + 2; ++i) ++per[per.size() - static_cast<size_t>(i)];
  }
  std::vector<std::pair<int, int>> out;
  int first = 0;
  for (int n : per) {
    out.emplace_back(first, first + n);
    first += n;
  }
  return out;
}

namespace {

// The first name component that is a decimal int: where it starts and its value.
std::optional<std::pair<size_t, int>> FirstNumber(std::string_view name) {
  size_t start = 0;
  while (start <= name.size()) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, dot - start);
    int value = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (!part.empty() && ec == std::errc() && end == part.data() + part.size() && value >= 0) {
      return std::pair<size_t, int>{start, value};
    }
    start = dot + 1;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> LayerOf(std::string_view name) {
  const auto number = FirstNumber(name);
  if (!number) return std::nullopt;
  return number->second;
}

std::string_view StackOf(std::string_view name) {
  const auto number = FirstNumber(name);
  return number ? name.substr(0, number->first) : std::string_view();
}

bool IsInputEmbedding(std::string_view name) {
  size_t start = 0;
  while (start <= name.size()) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, dot - start);
    for (std::string_view e : {"embed_tokens", "embed_positions", "wte", "wpe",
                               "word_embeddings", "embeddings"}) {
      if (part == e) return true;
    }
    start = dot + 1;
  }
  return false;
}

bool IsMtpComponent(std::string_view part) {
  return part == "mtp" || part.starts_with("mtp_");
}

namespace {

// A count from config.json: `key` at the top level, else in its text_config; none when absent.
Result<std::optional<int>> ConfigCount(const nlohmann::json& config, const char* key) {
  const nlohmann::json* at = nullptr;
  if (auto n = config.find(key); n != config.end()) {
    at = &*n;
  } else if (auto text = config.find("text_config"); text != config.end() && text->is_object()) {
    if (auto m = text->find(key); m != text->end()) at = &*m;
  }
  if (at == nullptr || at->is_null()) return std::optional<int>();
  if (!at->is_number_integer() || at->get<int64_t>() < 0 || at->get<int64_t>() > (1 << 20)) {
    return Status::InvalidArgument(
        fmt::format("config.json's {} is {}, not a layer count", key, at->dump()));
  }
  return std::optional<int>(at->get<int>());
}

// A stack of multi-token-prediction layers kept apart ("model.mtp_layers.", "mtp.layers."): a
// name component that IsMtpComponent.
bool IsMtpStack(std::string_view stack) {
  for (size_t start = 0; start < stack.size();) {
    const size_t dot = std::min(stack.find('.', start), stack.size());
    if (IsMtpComponent(stack.substr(start, dot - start))) return true;
    start = dot + 1;
  }
  return false;
}

// Where the tensors of another stack than the decoder's start: the stack's name to the first
// component that differs from the decoder's ("model.visual.blocks." beside "model.layers." →
// "model.visual."); empty when it has no component of its own.
std::string RootOf(std::string_view stack, std::string_view decoder) {
  size_t common = 0;  // the shared whole components
  for (size_t i = 0; i < stack.size() && i < decoder.size() && stack[i] == decoder[i]; ++i) {
    if (stack[i] == '.') common = i + 1;
  }
  const size_t dot = stack.find('.', common);
  // None when the stack is the shared part itself ("model." of "model.0.w"): it names no tower.
  return dot == std::string_view::npos ? std::string() : std::string(stack.substr(0, dot + 1));
}

// The decoder's stack among the numbered names: one whose distinct layers count `want` (or
// `want_mtp`) when the config gives them, the one of most tensors among those, else of all; an
// MTP stack never. The other stacks' roots go to `encoders`.
std::string DecoderStack(std::span<const std::string> names, std::optional<int> want,
                         int want_mtp, std::vector<std::string>& encoders) {
  std::map<std::string_view, std::pair<std::set<int>, size_t>> stacks;
  for (const std::string& n : names) {
    if (!LayerOf(n)) continue;
    auto& [layers, tensors] = stacks[StackOf(n)];
    layers.insert(*LayerOf(n));
    ++tensors;
  }
  std::string_view best;
  std::pair<bool, size_t> best_key{false, 0};
  for (const auto& [stack, seen] : stacks) {
    if (IsMtpStack(stack)) continue;
    const int count = static_cast<int>(seen.first.size());
    const bool fits = want && (count == *want || count == want_mtp);
    const std::pair<bool, size_t> key{fits, seen.second};
    if (key > best_key) best = stack, best_key = key;
  }
  for (const auto& [stack, seen] : stacks) {
    if (stack == best || IsMtpStack(stack)) continue;
    if (std::string root = RootOf(stack, best); !root.empty()) encoders.push_back(root);
  }
  return std::string(best);
}

}  // namespace

Result<PpModel> PpModelOf(std::string_view config_json, std::span<const std::string> names) {
  PpModel model;
  std::optional<int> configured;
  std::optional<bool> tied;
  if (!config_json.empty()) {
    const auto config = nlohmann::json::parse(config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return Status::InvalidArgument("config.json is not a JSON object");
    }
    LOADSTONE_ASSIGN_OR_RETURN(configured, ConfigCount(config, "num_hidden_layers"));
    LOADSTONE_ASSIGN_OR_RETURN(auto mtp, ConfigCount(config, "num_nextn_predict_layers"));
    model.mtp = mtp.value_or(0);
    if (auto t = config.find("tie_word_embeddings"); t != config.end() && t->is_boolean()) {
      tied = t->get<bool>();
    }
  }
  const int with_mtp = configured.value_or(0) + model.mtp;
  model.stack = DecoderStack(names, configured, with_mtp, model.encoders);
  int highest = -1;
  const std::string* beyond = nullptr;
  for (const std::string& n : names) {
    if (!LayerOf(n) || StackOf(n) != model.stack) continue;
    const int layer = *LayerOf(n);
    highest = std::max(highest, layer);
    if (configured && layer >= with_mtp && beyond == nullptr) beyond = &n;
  }
  if (beyond != nullptr) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is of layer {}, past config.json's num_hidden_layers {}{}: the config is "
        "not this checkpoint's",
        *beyond, *LayerOf(*beyond), *configured,
        model.mtp > 0 ? fmt::format(" and its {} num_nextn_predict_layers", model.mtp) : ""));
  }
  model.layers = configured.value_or(highest + 1);
  if (!configured) model.mtp = 0;
  model.tied = tied.value_or(std::find(names.begin(), names.end(), "lm_head.weight") ==
                             names.end());
  return model;
}

bool OnStage(std::string_view name, const PpModel& model,
             std::span<const std::pair<int, int>> ranges, int stage) {
  const int last = static_cast<int>(ranges.size()) - 1;
  const std::optional<int> layer = LayerOf(name);
  if (layer && (model.stack.empty() || StackOf(name) == model.stack)) {
    if (*layer >= model.layers) return stage == last;  // an MTP layer, after the head
    const auto& [first, end] = ranges[static_cast<size_t>(stage)];
    return *layer >= first && *layer < end;
  }
  if (layer && IsMtpStack(StackOf(name))) return stage == last;
  for (const std::string& root : model.encoders) {  // an encoder: the first layer takes its output
    if (name.starts_with(root)) return stage == 0;
  }
  if (IsInputEmbedding(name)) return stage == 0 || (model.tied && stage == last);
  return stage == last;
}

}  // namespace loadstone::planning
