// A file written front to back (the safetensors writer, offload .dat files, index.json, traces):
// each failure a Status naming the file and the byte offset it was written up to.
#ifndef LOADSTONE_IO_OUT_FILE_H_
#define LOADSTONE_IO_OUT_FILE_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "io/file.h"
#include "io/posix_error.h"
#include "loadstone/status.h"

namespace loadstone::io {

class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  // An uncommitted replacing file (OpenReplacing) is removed; `path` stays as it was.
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty()) ::unlink(temp_.c_str());
  }

  // Creates or truncates `path`.
  Status Open(const std::string& path) {
    path_ = path;
    offset_ = 0;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ < 0 ? ErrnoStatus(errno, "cannot create", path) : Status::OK();
  }
  // Opens a new file beside `path` (".NAME.XXXXXX" in the same folder, so that the rename is
  // atomic); `path` is untouched until Commit() renames the whole file over it. Closed or
  // destroyed without Commit(), the file is removed: `path` appears whole or not at all.
  Status OpenReplacing(const std::string& path) {
    std::string temp;
    LOADSTONE_RETURN_IF_ERROR(OpenBeside(path, &temp));
    temp_ = std::move(temp);
    return Status::OK();
  }
  // Creates a new file beside `path` (".NAME.XXXXXX" in the same folder), never one that exists,
  // and names it in `*created`; `path` is untouched. Unlike OpenReplacing, the file stays when
  // closed: the caller renames it over `path`, or removes it.
  Status OpenBeside(const std::string& path, std::string* created) {
    path_ = path;
    offset_ = 0;
    const size_t slash = path.rfind('/');
    std::string temp = slash == std::string::npos
                           ? "." + path + ".XXXXXX"
                           : path.substr(0, slash + 1) + "." + path.substr(slash + 1) + ".XXXXXX";
    fd_ = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd_ < 0) return ErrnoStatus(errno, "cannot create a file beside", path);
    ::fchmod(fd_, 0644);  // as Open asks for it (mkostemp makes 0600)
    *created = std::move(temp);
    return Status::OK();
  }
  // Writes into `fd` (owned from now on) as into a file created for `path`, which errors name.
  void Adopt(int fd, const std::string& path) {
    fd_ = fd;
    path_ = path;
    offset_ = 0;
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
  // Appends `length` bytes of `src` from `offset`, copied inside the kernel (copy_file_range:
  // page cache to page cache, no copy through user memory), or through a bounce buffer where the
  // kernel cannot. Errors: IOError naming either file and the offset; Corruption when `src`
  // ends before offset + length.
  Status CopyFrom(const File& src, uint64_t offset, uint64_t length);
  // Open(): closes the file. OpenReplacing(): closes it and removes it.
  Status Close() {
    int fd = std::exchange(fd_, -1);
    Status s = ::close(fd) != 0 ? ErrnoStatus(errno, "cannot close", path_) : Status::OK();
    if (!temp_.empty()) ::unlink(std::exchange(temp_, "").c_str());
    return s;
  }
  // OpenReplacing(): closes the file and renames it over the path it replaces.
  Status Commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoStatus(errno, "cannot close", path_);
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      return ErrnoStatus(errno, fmt::format("cannot rename '{}' to", temp_), path_);
    }
    temp_.clear();
    return Status::OK();
  }
  uint64_t offset() const { return offset_; }

 private:
  int fd_ = -1;
  std::string path_;
  std::string temp_;  // OpenReplacing's file until Commit()
  uint64_t offset_ = 0;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_OUT_FILE_H_
