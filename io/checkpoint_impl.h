// The Checkpoint catalog's state, shared by io/checkpoint.cc (Open, WithTensors, the accessors)
// and io/checkpoint_files.cc (reading a resolved path's files into it). Private to loadstone_io.
#ifndef LOADSTONE_IO_CHECKPOINT_IMPL_H_
#define LOADSTONE_IO_CHECKPOINT_IMPL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/formats/hf_layout.h"
#include "io/name_index.h"
#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone {

struct Checkpoint::Impl {
  CheckpointFormat format = CheckpointFormat::kSafetensors;
  std::vector<CheckpointFile> files;
  std::vector<TensorInfo> tensors;
  io::NameIndex by_name;  // tensors' names

  // Indexes the tensors' names; the first name that repeats an earlier one, or nullptr.
  const TensorInfo* IndexNames() {
    const size_t repeat = by_name.Build(tensors.size(), TensorName{this});
    return repeat == io::NameIndex::kNone ? nullptr : &tensors[repeat];
  }
  TensorInfo* Find(std::string_view name) {
    const std::optional<size_t> at = by_name.Find(name, TensorName{this});
    return at ? &tensors[*at] : nullptr;
  }
  const TensorInfo* Find(std::string_view name) const {
    return const_cast<Impl*>(this)->Find(name);
  }
  struct TensorName {
    const Impl* impl;
    std::string_view operator()(size_t i) const { return impl->tensors[i].name; }
  };

  std::map<std::string, std::string> metadata;
  std::string source;  // the path or address Open was given
  std::string index_path;
  std::string resolution;
  ModelConfig config;
  std::vector<std::string> warnings;
  uint64_t total_bytes = 0;
  uint64_t fingerprint = 0;
};

namespace io {

__extension__ using Wide = unsigned __int128;

// The bits of a tensor of `dtype` and `shape` (0 when a dimension is 0), multiplied in 128 bits
// and stopped once past `limit` — before a product can wrap: nullopt then. A hostile shape's
// size is never taken modulo 2^128.
inline std::optional<Wide> ShapeBits(DType dtype, const std::vector<uint64_t>& shape,
                                     Wide limit) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return Wide{0};
  Wide bits = DTypeBits(dtype);
  for (uint64_t d : shape) {
    bits *= d;  // bits <= limit < 2^68 before, d < 2^64: no wrap
    if (bits > limit) return std::nullopt;
  }
  return bits;
}

// Appends the files and tensors `resolved` names to `impl` (files, tensors, total_bytes,
// metadata, warnings): an offload folder's entries; an index's shards, in its order, checked
// against the index (index_path set then); or one file, a GGUF split set as a whole. Leaves
// by_name to the caller.
Status AddCheckpointFiles(const ResolvedCheckpoint& resolved, Checkpoint::Impl* impl);

// Appends the file at `path` of `format` to `impl` (a GGUF split set whole), as
// AddCheckpointFiles does for each file it adds.
Status AddCheckpointFile(CheckpointFormat format, const std::string& path, Checkpoint::Impl* impl);

}  // namespace io
}  // namespace loadstone

#endif  // LOADSTONE_IO_CHECKPOINT_IMPL_H_
