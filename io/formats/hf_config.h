// The model's config.json: the few fields a load needs (ModelConfig in checkpoint.h).
#ifndef LOADSTONE_IO_FORMATS_HF_CONFIG_H_
#define LOADSTONE_IO_FORMATS_HF_CONFIG_H_

#include <string>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Reads `path` (a config.json). Errors: IOError, Corruption (not JSON, larger than 16 MiB, a
// quantization_config whose weight_block_size is not two positive integers, or whose bits or
// group_size is not an integer in range).
Result<ModelConfig> ReadModelConfig(const std::string& path);

// Reads AutoGPTQ's quantize_config.json at `path` (the quantization settings a GPTQ checkpoint
// without a quantization_config keeps beside its weights) into `config`'s quantization fields;
// quant_method "gptq" unless it names another. Errors as ReadModelConfig's (larger than 1 MiB).
Status ReadQuantizeConfig(const std::string& path, ModelConfig* config);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_HF_CONFIG_H_
