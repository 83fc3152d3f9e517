#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "io/http_reader.h"
#include "io/posix_error.h"

namespace loadstone::io {
namespace {

FileStamp StampOf(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<int64_t>(st.st_mtim.tv_sec), static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

// OK when the file at `path`, `bytes` long and stamped `now`, is the one `catalogued` describes.
Status Unchanged(const std::string& path, uint64_t bytes, const FileStamp& now,
                 const CheckpointFile& catalogued) {
  std::string what;
  const FileStamp& then = catalogued.stamp;
  if (then.known() && !then.SameFile(now)) {
    what = fmt::format("another file is there now: device {} inode {} then, device {} inode {} now",
                       then.device, then.inode, now.device, now.inode);
  } else if (catalogued.bytes != bytes) {
    what = fmt::format("{} bytes then, {} now", catalogued.bytes, bytes);
  } else if (!then.validator.empty() && then.validator != now.validator) {
    what = fmt::format("another version: {} then, {} now", then.validator, now.validator);
  } else if (then.known() && then != now) {
    what = fmt::format("rewritten: modification time {}.{:09} then, {}.{:09} now", then.mtime_sec,
                       then.mtime_nsec, now.mtime_sec, now.mtime_nsec);
  } else {
    return Status::OK();
  }
  return Status::Corruption(fmt::format(
      "'{}' changed since its header was read ({}); its catalog no longer describes it: open the "
      "checkpoint again",
      path, what));
}

}  // namespace

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), path_(std::move(other.path_)),
      stamp_(std::move(other.stamp_)), remote_(std::move(other.remote_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
    stamp_ = std::move(other.stamp_);
    remote_ = std::move(other.remote_);
  }
  return *this;
}

Result<File> File::OpenForRead(const std::string& path, int extra_flags) {
  if (IsRemoteAddress(path)) {
    LOADSTONE_ASSIGN_OR_RETURN(std::shared_ptr<RemoteObject> remote, RemoteObject::Open(path));
    File file(-1, remote->object().size, path);
    file.stamp_.validator = remote->object().version();
    file.remote_ = std::move(remote);
    return file;
  }
  int fd;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  File file(fd, 0, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) return ErrnoStatus(EISDIR, "cannot read", path);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is not a regular file ({}); give a checkpoint file or folder", path,
        S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus(errno, "cannot set up", path);
  }
  file.size_ = static_cast<uint64_t>(st.st_size);
  file.stamp_ = StampOf(st);
  return file;
}

Status File::ReadExact(uint64_t offset, std::span<std::byte> dst) const {
  if (remote_) {
    if (offset > size_ || dst.size() > size_ - offset) {
      return Status::Corruption(fmt::format(
          "'{}' is truncated: wanted {} bytes at offset {}, the object ends at {}", path_,
          dst.size(), offset, size_));
    }
    return remote_->Read(offset, dst);
  }
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done,
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("read {} bytes at offset {} of", dst.size() - done,
                                            offset + done),
                         path_);
    }
    if (n == 0) {
      return Status::Corruption(fmt::format(
          "'{}' is truncated: wanted {} bytes at offset {}, the file ends at {}", path_,
          dst.size(), offset, offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<uint64_t> File::SizeNow() const {
  if (remote_) return size_;  // each range checks the object's size and version
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, "cannot stat", path_);
  return static_cast<uint64_t>(st.st_size);
}

Status CheckUnchanged(const File& file, const CheckpointFile& catalogued) {
  return Unchanged(file.path(), file.size(), file.stamp(), catalogued);
}

Status CheckUnchangedNow(const File& file, const CheckpointFile& catalogued) {
  if (file.remote()) return CheckUnchanged(file, catalogued);
  struct stat st;
  if (::fstat(file.fd(), &st) != 0) return ErrnoStatus(errno, "cannot stat", file.path());
  return Unchanged(file.path(), static_cast<uint64_t>(st.st_size), StampOf(st), catalogued);
}

}  // namespace loadstone::io
