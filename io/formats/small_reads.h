// The few data bytes a catalog reads at Open besides headers (a quantized weight's quant state):
// whole small tensors, one open file per checkpoint file.
#ifndef LOADSTONE_IO_FORMATS_SMALL_READS_H_
#define LOADSTONE_IO_FORMATS_SMALL_READS_H_

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"
#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// "tensor 'NAME' (file 'PATH', offset N)": how a catalog's errors name a tensor.
inline std::string TensorAt(const std::vector<CheckpointFile>& files, const TensorInfo& t) {
  return fmt::format("tensor '{}' (file '{}', offset {})", t.name, files[t.file].path, t.offset);
}

class SmallReads {
 public:
  explicit SmallReads(const std::vector<CheckpointFile>& files) : files_(files) {}

  // Tensor `t`'s bytes. REQUIRES: the caller bounded t.nbytes.
  Result<std::vector<std::byte>> Bytes(const TensorInfo& t) {
    auto it = open_.find(t.file);
    if (it == open_.end()) {
      LOADSTONE_ASSIGN_OR_RETURN(File f, File::OpenForRead(files_[t.file].path));
      it = open_.emplace(t.file, std::move(f)).first;
    }
    std::vector<std::byte> out(t.nbytes);
    LOADSTONE_RETURN_IF_ERROR(it->second.ReadExact(t.offset, out));
    return out;
  }

  // The first N f32 values of tensor `t`. REQUIRES: it holds at least N.
  template <size_t N>
  Result<std::array<float, N>> Floats(const TensorInfo& t) {
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, Bytes(t));
    std::array<float, N> out{};
    std::memcpy(out.data(), bytes.data(), sizeof(out));
    return out;
  }

 private:
  const std::vector<CheckpointFile>& files_;
  std::map<uint32_t, File> open_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_SMALL_READS_H_
