// accelerate's offload folder: `index.json` mapping each tensor name to {"dtype", "shape"} with
// one raw C-order `NAME.dat` per tensor beside it (numpy dtype names; bfloat16 stored as its
// int16 view; a scalar as one element with shape []), or to {"safetensors_file", "weight_name",
// "dtype"}: a tensor read where it is in a safetensors file. What accelerate's offload_weight /
// save_offload_index write and OffloadedWeightsLoader reads.
#ifndef LOADSTONE_IO_FORMATS_OFFLOAD_FOLDER_H_
#define LOADSTONE_IO_FORMATS_OFFLOAD_FOLDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/formats/limits.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct OffloadIndexEntry {
  std::string name;
  // A .dat entry: its dtype and shape. A safetensors entry: the dtype accelerate casts it to
  // when it reads it (nullopt when the entry names none); the shape is the file's.
  std::optional<DType> dtype;
  std::vector<uint64_t> shape;
  std::string safetensors_file;  // set: read in place from that file...
  std::string weight_name;       // ...under this name (the entry's name when absent)
};

// The numpy name accelerate records: "float32", "int64", "bool", "bfloat16" (stored as int16).
// nullopt for the dtypes numpy has no name for (float8, float4, ...).
std::optional<std::string_view> OffloadDTypeName(DType dtype);

// `folder`/index.json, entries in document order. A name that would leave the folder as a file
// name (empty, containing '/' or NUL, "." or "..") is refused, as is an entry of neither kind.
// index.json is read whole: one beyond kMaxOffloadIndexBytes is refused before it is read.
// Errors: NotFound, IOError, Corruption (naming the entry and what is wrong), Unsupported (the
// bound).
Result<std::vector<OffloadIndexEntry>> ReadOffloadIndex(const std::string& folder);

// The path of a .dat entry: folder/NAME.dat.
std::string OffloadDataPath(std::string_view folder, std::string_view name);

// A tensor name usable as NAME.dat (see ReadOffloadIndex). Errors: InvalidArgument.
Status CheckOffloadName(std::string_view name);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_OFFLOAD_FOLDER_H_
