// The built-in default model: a synthetic, Llama-shaped, sharded bf16 checkpoint with
// deterministic contents, written once into a cache folder.
#ifndef LOADSTONE_TOOLS_DEMO_MODEL_H_
#define LOADSTONE_TOOLS_DEMO_MODEL_H_

#include <cstdint>
#include <functional>
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

// The file the demo writes into the folders it makes; only a folder holding it is ever
// replaced.
inline constexpr const char* kDemoMarker = ".loadstone-demo";

// Writes the model into `folder` unless a complete one (index present, matching size) is
// already there. The folder must not exist, be empty, or be one the demo made (kDemoMarker):
// anything else is refused (InvalidArgument) and left as it is. Written beside the folder and
// renamed into place whole; when `cancelled` turns true the write stops (Cancelled) and nothing
// of it is left. Returns the folder.
Result<std::string> EnsureDemoModel(const std::string& folder, const DemoModelShape& shape,
                                    const std::function<bool()>& cancelled = {});

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_DEMO_MODEL_H_
