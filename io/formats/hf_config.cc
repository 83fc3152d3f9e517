#include "io/formats/hf_config.h"

#include <fmt/format.h>

#include "io/formats/json_util.h"

namespace loadstone::io {
namespace {

Result<ModelConfig> ToConfig(const nlohmann::json& doc, const std::string& path,
                             const std::string& what) {
  ModelConfig config;
  config.path = path;
  if (!doc.is_object()) return Status::Corruption(what + " is not a JSON object");
  auto q = doc.find("quantization_config");
  if (q == doc.end() || q->is_null()) return config;
  if (!q->is_object()) return Status::Corruption(what + ": quantization_config is not an object");
  if (auto m = q->find("quant_method"); m != q->end() && m->is_string()) {
    config.quant_method = m->get<std::string>();
  }
  auto block = q->find("weight_block_size");
  if (block == q->end() || block->is_null()) return config;
  const bool pair = block->is_array() && block->size() == 2 && (*block)[0].is_number_unsigned() &&
                    (*block)[1].is_number_unsigned() && (*block)[0].get<uint64_t>() > 0 &&
                    (*block)[1].get<uint64_t>() > 0;
  if (!pair) {
    return Status::Corruption(fmt::format(
        "{}: quantization_config.weight_block_size is {}, not two positive integers", what,
        DescribeJsonValue(*block)));
  }
  config.weight_block_size = std::array<uint64_t, 2>{(*block)[0].get<uint64_t>(),
                                                     (*block)[1].get<uint64_t>()};
  return config;
}

}  // namespace

Result<ModelConfig> ReadModelConfig(const std::string& path) {
  const std::string what = fmt::format("config '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(auto doc, ReadJsonFile(path, what, 16ULL << 20));
  return InterpretJson(what, [&] { return ToConfig(doc, path, what); });
}

}  // namespace loadstone::io
