// Which file(s) a user's path means: a file, an index, or a Hugging Face model folder with
// variants and subfolders.
#ifndef LOADSTONE_IO_FORMATS_HF_LAYOUT_H_
#define LOADSTONE_IO_FORMATS_HF_LAYOUT_H_

#include <string>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct ResolvedCheckpoint {
  enum class Kind { kFile, kIndex };
  Kind kind = Kind::kFile;
  // The file's format, or the shards' (an index over .bin shards: kPyTorch).
  CheckpointFormat format = CheckpointFormat::kSafetensors;
  std::string path;  // the checkpoint file or the index file
  std::string note;  // how it was chosen, for the user
  std::string config_dir;  // where the model's config.json would be; empty for a single file
};

// Preference in a folder (Hugging Face's order): for the Transformers names (`model`
// safetensors, `pytorch_model` .bin) then the diffusers ones (`diffusion_pytorch_model`), the
// single file `P[.V].safetensors`, the index `P.safetensors.index[.V].json` (legacy:
// `P.V.safetensors.index.json`), the single `P[.V].bin`, the index `P.bin.index[.V].json`
// (legacy `P.V.bin.index.json`); what else was there is named in the note. Two families both
// present, or no candidate, are errors that list what the folder holds and, where it is the
// obvious fix, say which --subfolder or --variant would find weights. A path that is neither a
// regular file nor a folder (a FIFO, a device) is refused before anything opens it.
Result<ResolvedCheckpoint> ResolveCheckpointPath(const std::string& path,
                                                 const OpenOptions& options);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_HF_LAYOUT_H_
