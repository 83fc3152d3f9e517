// Which file(s) a user's path means: a file, an index, or a Hugging Face model folder with
// variants and subfolders.
#ifndef LOADSTONE_IO_FORMATS_HF_LAYOUT_H_
#define LOADSTONE_IO_FORMATS_HF_LAYOUT_H_

#include <string>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct ResolvedCheckpoint {
  enum class Kind { kSafetensorsFile, kSafetensorsIndex };
  Kind kind = Kind::kSafetensorsFile;
  std::string path;  // the .safetensors file or the index file
  std::string note;  // how it was chosen, for the user
  std::string config_dir;  // where the model's config.json would be; empty for a single file
};

// Preference in a folder (Hugging Face's order): for the prefixes `model` then
// `diffusion_pytorch_model`, the single file `P[.V].safetensors` before the index
// `P.safetensors.index[.V].json` (legacy: `P.V.safetensors.index.json`). Two prefixes both
// present, or no candidate, are errors that list what the folder holds and, where it is the
// obvious fix, say which --subfolder or --variant would find weights. A path that is neither a
// regular file nor a folder (a FIFO, a device) is refused before anything opens it.
Result<ResolvedCheckpoint> ResolveCheckpointPath(const std::string& path,
                                                 const OpenOptions& options);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_HF_LAYOUT_H_
