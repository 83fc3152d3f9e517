// Pipeline-parallel stages (pp_rules.h).
#include "runtime/plan/pp_rules.h"

#include <algorithm>
#include <charconv>

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

std::optional<int> LayerOf(std::string_view name) {
  size_t start = 0;
  while (start <= name.size()) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, dot - start);
    int value = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (!part.empty() && ec == std::errc() && end == part.data() + part.size() && value >= 0) {
      return value;
    }
    start = dot + 1;
  }
  return std::nullopt;
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

Result<PpModel> PpModelOf(std::string_view config_json, std::span<const std::string> names) {
  PpModel model;
  std::optional<int> configured;
  std::optional<bool> tied;
  if (!config_json.empty()) {
    const auto config = nlohmann::json::parse(config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return Status::InvalidArgument("config.json is not a JSON object");
    }
    if (auto n = config.find("num_hidden_layers"); n != config.end()) {
      if (!n->is_number_integer() || n->get<int64_t>() < 0 || n->get<int64_t>() > (1 << 20)) {
        return Status::InvalidArgument(fmt::format(
            "config.json's num_hidden_layers is {}, not a layer count", n->dump()));
      }
      configured = n->get<int>();
    }
    if (auto t = config.find("tie_word_embeddings"); t != config.end() && t->is_boolean()) {
      tied = t->get<bool>();
    }
  }
  int highest = -1;
  const std::string* beyond = nullptr;
  for (const std::string& n : names) {
    const std::optional<int> layer = LayerOf(n);
    if (!layer) continue;
    highest = std::max(highest, *layer);
    if (configured && *layer >= *configured && beyond == nullptr) beyond = &n;
  }
  if (beyond != nullptr) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is of layer {}, past config.json's num_hidden_layers {}: the config is not "
        "this checkpoint's",
        *beyond, *LayerOf(*beyond), *configured));
  }
  model.layers = configured.value_or(highest + 1);
  model.tied = tied.value_or(std::find(names.begin(), names.end(), "lm_head.weight") ==
                             names.end());
  return model;
}

bool OnStage(std::string_view name, const PpModel& model,
             std::span<const std::pair<int, int>> ranges, int stage) {
  const int last = static_cast<int>(ranges.size()) - 1;
  if (const std::optional<int> layer = LayerOf(name)) {
    const auto& [first, end] = ranges[static_cast<size_t>(stage)];
    return *layer >= first && *layer < end;
  }
  if (IsInputEmbedding(name)) return stage == 0 || (model.tied && stage == last);
  return stage == last;
}

}  // namespace loadstone::planning
