// PyTorch checkpoints as torch.save (1.6 and later) writes them: a stored zip archive whose
// data.pkl describes the tensors and whose data/<key> entries hold their storages
// (shared/specs/torch-zip.md). Reading one reads the central directory, the local headers and
// data.pkl — never a storage's bytes — and yields a catalog with each tensor's real file offset.
#ifndef LOADSTONE_IO_FORMATS_TORCH_ZIP_H_
#define LOADSTONE_IO_FORMATS_TORCH_ZIP_H_

#include <string>
#include <vector>

#include "io/formats/limits.h"
#include "io/file.h"
#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct TorchArchive {
  // Sorted by file offset (ties by name); TensorInfo::file is 0. Tensors that view one storage
  // have the same TensorInfo::storage and overlapping bytes.
  std::vector<TensorInfo> tensors;
  std::vector<std::string> notes;  // what was taken and how ("state dict under key 'model'", ...)
  bool big_endian = false;         // its byteorder entry says "big"
};

// Errors: Unsupported for what loadstone refuses to run or does not read (a global or opcode off
// the allowlists, a deflated entry, a legacy pre-1.6 file, a TorchScript archive: each message
// says what it is and how to convert it); Corruption for a damaged archive or pickle (the
// message names the entry, tensor or byte position).
Result<TorchArchive> ReadTorchArchive(const File& file);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_TORCH_ZIP_H_
