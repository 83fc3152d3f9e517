// GGUF files (llama.cpp), read by every rule of shared/specs/gguf.md: the header, the metadata
// key-values and the tensor infos, each count and length checked against the bytes that remain
// before anything is allocated for it, every tensor's bytes inside the data section.
//
// Tensors of a float or integer ggml type become TensorInfos of that DType. A block-quantized
// tensor (Q4_0, Q8_0, Q4_K, ...) is cataloged as the gguf package's reader holds it: U8 with its
// byte shape (the last dimension in bytes, rows of whole blocks), its ggml type name and
// element shape in TensorInfo::packed; it loads as stored.
#ifndef LOADSTONE_IO_FORMATS_GGUF_H_
#define LOADSTONE_IO_FORMATS_GGUF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/file.h"
#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::io {

// A ggml tensor type: its number in the file, the name ggml gives it, and its block.
struct GgmlType {
  uint32_t id = 0;
  std::string_view name;      // "F32", "Q4_K", ...
  uint32_t block_elems = 1;   // elements per block
  uint32_t block_bytes = 0;   // bytes per block
  std::optional<DType> dtype;  // the element type of an unquantized type
};

// nullptr for a number that names no type (or a removed one).
const GgmlType* GgmlTypeById(uint32_t id);

struct GgufFile {
  uint32_t version = 0;
  uint32_t alignment = 32;
  uint64_t data_start = 0;
  // Metadata in file order: key → value as text (numbers, true/false, strings as they are,
  // arrays as JSON of up to kGgufArrayShown elements, longer ones as "[N x TYPE]").
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<TensorInfo> tensors;  // in file order, which is offset order; file = 0
};

inline constexpr size_t kGgufArrayShown = 16;

// Reads and checks the header of `file`; Corruption names the rule broken and its byte offset
// ("GGUF: tensor 'x' ne[0] = 33 is not a multiple of the Q4_0 block (32) (byte 412)").
Result<GgufFile> ReadGgufHeader(const File& file);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_GGUF_H_
