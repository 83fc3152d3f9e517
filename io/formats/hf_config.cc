#include "io/formats/hf_config.h"

#include <fmt/format.h>

#include "io/formats/json_util.h"
#include "io/formats/limits.h"

namespace loadstone::io {
namespace {

// A quantization config object (config.json's quantization_config, or AutoGPTQ's
// quantize_config.json) into `config`.
Status ToQuantization(const nlohmann::json& q, const std::string& what, ModelConfig* config) {
  if (auto m = q.find("quant_method"); m != q.end() && m->is_string()) {
    config->quant_method = m->get<std::string>();
  }
  // An integer setting under any of `keys`: absent, or a whole number in [lo, hi].
  auto integer = [&](std::initializer_list<const char*> keys, int64_t lo, int64_t hi,
                     auto* out) -> Status {
    for (const char* key : keys) {
      auto v = q.find(key);
      if (v == q.end() || v->is_null()) continue;
      if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
        return Status::Corruption(fmt::format("{}: quantization {} is {}, not an integer in "
                                              "[{}, {}]",
                                              what, key, DescribeJsonValue(*v), lo, hi));
      }
      *out = static_cast<std::remove_reference_t<decltype(**out)>>(v->get<int64_t>());
      return Status::OK();
    }
    return Status::OK();
  };
  LOADSTONE_RETURN_IF_ERROR(integer({"bits", "w_bit"}, 1, 32, &config->bits));
  LOADSTONE_RETURN_IF_ERROR(
      integer({"group_size", "q_group_size"}, -1, int64_t{1} << 31, &config->group_size));
  for (auto [key, out] : {std::pair{"checkpoint_format", &config->checkpoint_format},
                          std::pair{"version", &config->version}}) {
    if (auto v = q.find(key); v != q.end() && v->is_string()) *out = v->get<std::string>();
  }
  auto block = q.find("weight_block_size");
  if (block == q.end() || block->is_null()) return Status::OK();
  const bool pair = block->is_array() && block->size() == 2 && (*block)[0].is_number_unsigned() &&
                    (*block)[1].is_number_unsigned() && (*block)[0].get<uint64_t>() > 0 &&
                    (*block)[1].get<uint64_t>() > 0;
  if (!pair) {
    return Status::Corruption(fmt::format(
        "{}: quantization_config.weight_block_size is {}, not two positive integers", what,
        DescribeJsonValue(*block)));
  }
  config->weight_block_size = std::array<uint64_t, 2>{(*block)[0].get<uint64_t>(),
                                                      (*block)[1].get<uint64_t>()};
  return Status::OK();
}

// A layer count at the top level of `doc`, else in its text_config: none when absent or not a
// count (it only orders reads).
std::optional<int> LayerCount(const nlohmann::json& doc, const char* key) {
  const nlohmann::json* at = nullptr;
  if (auto n = doc.find(key); n != doc.end()) {
    at = &*n;
  } else if (auto text = doc.find("text_config"); text != doc.end() && text->is_object()) {
    if (auto m = text->find(key); m != text->end()) at = &*m;
  }
  if (at == nullptr || !at->is_number_integer()) return std::nullopt;
  const int64_t n = at->get<int64_t>();
  if (n < 0 || n > (1 << 20)) return std::nullopt;
  return static_cast<int>(n);
}

Result<ModelConfig> ToConfig(const nlohmann::json& doc, const std::string& path,
                             const std::string& what) {
  ModelConfig config;
  config.path = path;
  if (!doc.is_object()) return Status::Corruption(what + " is not a JSON object");
  config.num_hidden_layers = LayerCount(doc, "num_hidden_layers");
  config.num_nextn_predict_layers = LayerCount(doc, "num_nextn_predict_layers").value_or(0);
  auto q = doc.find("quantization_config");
  if (q == doc.end() || q->is_null()) return config;
  if (!q->is_object()) return Status::Corruption(what + ": quantization_config is not an object");
  LOADSTONE_RETURN_IF_ERROR(ToQuantization(*q, what, &config));
  return config;
}

}  // namespace

Result<ModelConfig> ReadModelConfig(const std::string& path) {
  const std::string what = fmt::format("config '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(std::string text,
                             ReadSmallFile(path, what, kMaxConfigBytes, "kMaxConfigBytes"));
  LOADSTONE_ASSIGN_OR_RETURN(auto doc, ParseJsonStrict(text, what));
  auto config = InterpretJson(what, [&] { return ToConfig(doc, path, what); });
  if (config.ok()) config->text = std::move(text);
  return config;
}

Status ReadQuantizeConfig(const std::string& path, ModelConfig* config) {
  const std::string what = fmt::format("quantize config '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(
      auto doc, ReadJsonFile(path, what, kMaxQuantizeConfigBytes, "kMaxQuantizeConfigBytes"));
  return InterpretJson(what, [&]() -> Status {
    if (!doc.is_object()) return Status::Corruption(what + " is not a JSON object");
    ModelConfig read;
    LOADSTONE_RETURN_IF_ERROR(ToQuantization(doc, what, &read));
    config->quant_method = read.quant_method.empty() ? "gptq" : read.quant_method;
    config->bits = read.bits;
    config->group_size = read.group_size;
    config->checkpoint_format = read.checkpoint_format;
    return Status::OK();
  });
}

}  // namespace loadstone::io
