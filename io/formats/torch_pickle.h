// The `data.pkl` of a torch.save archive, read by a data parser that is not an interpreter
// (shared/specs/torch-zip.md): a fixed opcode set, a fixed allowlist of globals, each of which
// builds a value here (a dict, a tensor record, a tuple) and never calls anything. What it
// yields is a list of tensor records — the storage each views, its element offset, size and
// stride — that the caller checks against the archive's storage entries.
#ifndef LOADSTONE_IO_FORMATS_TORCH_PICKLE_H_
#define LOADSTONE_IO_FORMATS_TORCH_PICKLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct PickledStorage {
  std::string key;        // the archive entry is "<prefix>/data/<key>"
  DType dtype = DType::kU8;
  bool untyped = false;   // torch.UntypedStorage: `numel` counts bytes
  uint64_t numel = 0;     // as pickled: elements of a typed storage, bytes of an untyped one
  std::string location;   // "cpu", "cuda:0", ...
};

struct PickledTensor {
  std::string name;
  uint32_t storage = 0;  // index into PickledStateDict::storages
  DType dtype = DType::kF32;
  uint64_t offset = 0;   // in elements of `dtype`
  std::vector<uint64_t> size;
  std::vector<uint64_t> stride;
  bool parameter = false;
};

struct PickledStateDict {
  std::vector<PickledStorage> storages;  // in order of first appearance
  std::vector<PickledTensor> tensors;    // in the dict's order
  // The key of the top-level dict whose value was taken as the state dict ("state_dict",
  // "model", ...), or empty when the top level is the state dict.
  std::string state_dict_key;
  // Entries that are not tensors (an epoch counter, optimizer state) and were left out.
  std::vector<std::string> skipped;
  int protocol = 0;
  // Protocol-4 opcodes (FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL) that were met: harmless,
  // accepted, and reported (torch.load(weights_only=True) refuses them).
  bool protocol4_opcodes = false;
};

// Parses `pickle` (the bytes of data.pkl). `where` names the file in messages. Refusals are
// Unsupported ("unsupported global builtins.print at byte 14 ...", "unsupported pickle opcode
// 0x63 at byte 2"); broken streams are Corruption with the byte position (truncated, memo index
// out of range, stack underflow, a persistent id that is not a storage).
Result<PickledStateDict> ParseTorchPickle(std::string_view pickle, std::string_view where);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_TORCH_PICKLE_H_
