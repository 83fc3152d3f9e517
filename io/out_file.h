// A file written front to back (the safetensors writer, offload .dat files and index.json): each
// failure a Status naming the file and the byte offset it was written up to.
#ifndef LOADSTONE_IO_OUT_FILE_H_
#define LOADSTONE_IO_OUT_FILE_H_

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "io/posix_error.h"
#include "loadstone/status.h"

namespace loadstone::io {

class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Creates or truncates `path`.
  Status Open(const std::string& path) {
    path_ = path;
    offset_ = 0;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ < 0 ? ErrnoStatus(errno, "cannot create", path) : Status::OK();
  }
  Status Write(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return ErrnoStatus(errno, fmt::format("cannot write {} bytes at offset {}", bytes.size(), offset_),
                           path_);
      }
      bytes = bytes.subspan(static_cast<size_t>(n));
      offset_ += static_cast<uint64_t>(n);
    }
    return Status::OK();
  }
  Status Write(std::string_view text) { return Write(std::as_bytes(std::span(text.data(), text.size()))); }
  Status Close() {
    int fd = std::exchange(fd_, -1);
    return ::close(fd) != 0 ? ErrnoStatus(errno, "cannot close", path_) : Status::OK();
  }
  uint64_t offset() const { return offset_; }

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t offset_ = 0;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_OUT_FILE_H_
