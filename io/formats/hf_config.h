// The model's config.json: the few fields a load needs (ModelConfig in checkpoint.h).
#ifndef LOADSTONE_IO_FORMATS_HF_CONFIG_H_
#define LOADSTONE_IO_FORMATS_HF_CONFIG_H_

#include <string>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Reads `path` (a config.json). Errors: IOError, Corruption (not JSON, larger than 16 MiB, a
// quantization_config whose weight_block_size is not two positive integers).
Result<ModelConfig> ReadModelConfig(const std::string& path);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_HF_CONFIG_H_
