#include "io/out_file.h"

#include <memory>

namespace loadstone::io {

Status OutFile::CopyFrom(const File& src, uint64_t offset, uint64_t length) {
  auto failed = [&](int err, uint64_t at) {
    return ErrnoStatus(err, fmt::format("cannot copy {} bytes at offset {} of '{}' to offset {}",
                                        length, at, src.path(), offset_),
                       path_);
  };
  auto ended = [&](uint64_t at) {
    return Status::Corruption(fmt::format("'{}' ends at {} while {} bytes from offset {} were to "
                                          "be copied out of it; open the checkpoint again",
                                          src.path(), at, length, offset));
  };
  uint64_t done = 0;
  bool in_kernel = true;
  std::unique_ptr<std::byte[]> bounce;
  constexpr uint64_t kBounce = 4ULL << 20;
  while (done < length) {
    const uint64_t want = length - done;
    if (in_kernel) {
      loff_t from = static_cast<loff_t>(offset + done);
      const ssize_t n = ::copy_file_range(src.fd(), &from, fd_, nullptr, want, 0);
      if (n > 0) {
        done += static_cast<uint64_t>(n);
        offset_ += static_cast<uint64_t>(n);
        continue;
      }
      if (n == 0) return ended(offset + done);
      if (errno == EINTR) continue;
      // Kernels and file systems without it (ENOSYS, EXDEV, EINVAL, EOPNOTSUPP): through memory.
      if (errno != ENOSYS && errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP) {
        return failed(errno, offset + done);
      }
      in_kernel = false;
      bounce = std::make_unique<std::byte[]>(kBounce);
    }
    const uint64_t piece = std::min(want, kBounce);
    const ssize_t n = ::pread(src.fd(), bounce.get(), piece, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return failed(errno, offset + done);
    if (n == 0) return ended(offset + done);
    LOADSTONE_RETURN_IF_ERROR(Write(std::span<const std::byte>(bounce.get(), static_cast<size_t>(n))));
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace loadstone::io
