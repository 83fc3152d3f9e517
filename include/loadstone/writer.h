// Writes safetensors files laid out like the reference writer: tensors sorted by dtype
// (descending, in the reference's dtype order) then name, header JSON compact with
// "__metadata__" first, padded with spaces so that the data starts 8-byte aligned. Used by the
// tests, the demo model generator, offload and convert.
#ifndef LOADSTONE_WRITER_H_
#define LOADSTONE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  // The bytes: either `data` (exactly the tensor's size), or `fill`, called with consecutive
  // chunks (offset within the tensor, buffer to fill) so that large tensors need not be held in
  // memory at once. A fill that fails stops the write with its error (nothing is written).
  std::span<const std::byte> data;
  std::function<Status(uint64_t offset, std::span<std::byte> chunk)> fill;

  uint64_t nbytes() const;  // from dtype and shape
};

// Writes one file, whole or not at all: the bytes go to a new file beside `path` (".NAME.XXXXXX"),
// renamed over `path` once complete; on any error that file is removed and `path` is as it was.
// Errors: InvalidArgument (duplicate name, data size ≠ shape × dtype, a size that is not whole
// bytes), IOError.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// The order WriteSafetensors lays `tensors` out in, as indices: dtype descending (in the
// reference's dtype order), then name.
std::vector<size_t> LayoutOrder(const std::vector<TensorToWrite>& tensors);

// How WriteShardedSafetensors splits `tensors` (indices, in the given order) into shards, as
// Hugging Face does (huggingface_hub's split_state_dict_into_shards, which save_pretrained
// uses): a tensor that would push the current shard past `max_shard_size` bytes closes it and
// starts the next; a tensor larger than that gets a shard of its own at once, and the current
// shard goes on after it. Shards in the order they were closed; no tensors: one empty shard.
std::vector<std::vector<size_t>> SplitIntoShards(const std::vector<TensorToWrite>& tensors,
                                                 uint64_t max_shard_size);

struct ShardedWriteOptions {
  std::string prefix = "model";  // model-00001-of-00002.safetensors, model.safetensors.index.json
  // Hugging Face's `variant=`: "fp16" names model.fp16.safetensors, or shards
  // model.fp16-00001-of-00002.safetensors with the index model.safetensors.index.fp16.json.
  std::string variant;
  uint64_t max_shard_size = 5'000'000'000;  // bytes of tensor data per shard (HF's rule)
  std::map<std::string, std::string> metadata;  // each shard's __metadata__
};

// Writes shards and the index into `folder` (created if missing), split by SplitIntoShards.
// One shard only → `prefix[.variant].safetensors`, no index. Returns the paths written (shards,
// then the index), each written whole as WriteSafetensors writes it. A failed write removes the
// files this call wrote; a file of the same name that it replaced is not brought back (write
// into a new folder and rename it to replace a checkpoint folder whole).
Result<std::vector<std::string>> WriteShardedSafetensors(const std::string& folder,
                                                         const std::vector<TensorToWrite>& tensors,
                                                         const ShardedWriteOptions& options = {});

}  // namespace loadstone

#endif  // LOADSTONE_WRITER_H_
