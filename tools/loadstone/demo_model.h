// The built-in default model: a synthetic, Llama-shaped, sharded bf16 checkpoint with
// deterministic contents, written once into a cache folder.
#ifndef LOADSTONE_TOOLS_DEMO_MODEL_H_
#define LOADSTONE_TOOLS_DEMO_MODEL_H_

#include <cstdint>
#include <string>

#include "loadstone/status.h"

namespace loadstone::cli {

struct DemoModelShape {
  int layers = 16;
  int hidden = 2048;
  int intermediate = 5632;
  int kv_heads_ratio = 4;  // hidden / (kv projection width)
  int vocab = 32000;
  uint64_t max_shard_size = 500'000'000;
};

// ~1.7 GB with the defaults.
uint64_t DemoModelBytes(const DemoModelShape& shape);

// The cache folder: $LOADSTONE_CACHE, else $XDG_CACHE_HOME/loadstone, else ~/.cache/loadstone.
std::string DefaultCacheDir();

// Writes the model into `folder` unless a complete one (index present, matching size) is
// already there. Returns the folder.
Result<std::string> EnsureDemoModel(const std::string& folder, const DemoModelShape& shape);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_DEMO_MODEL_H_
