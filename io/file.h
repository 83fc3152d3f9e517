// File: an owned file descriptor with exact positional reads.
#ifndef LOADSTONE_IO_FILE_H_
#define LOADSTONE_IO_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

class RemoteObject;  // io/http_reader.h

class File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Opens `path` read-only (O_CLOEXEC, plus `extra_flags` such as O_DIRECT) and records its
  // size. A folder is refused. An http:// or https:// address opens the object behind it
  // (io::RemoteObject): ReadExact, size, stamp (its validator) and SizeNow work, fd() is -1.
  static Result<File> OpenForRead(const std::string& path, int extra_flags = 0);

  // Reads exactly dst.size() bytes at `offset`, retrying EINTR and short reads. Reaching the
  // end of the file first is a Corruption error naming the path and offset ("truncated").
  Status ReadExact(uint64_t offset, std::span<std::byte> dst) const;

  int fd() const { return fd_; }
  bool remote() const { return remote_ != nullptr; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The file as it was opened: device, inode, modification time.
  const FileStamp& stamp() const { return stamp_; }
  // Its size now (fstat of the descriptor). Errors: IOError naming the path.
  Result<uint64_t> SizeNow() const;

 private:
  File(int fd, uint64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}

  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  FileStamp stamp_;
  std::shared_ptr<RemoteObject> remote_;
};

// OK when `file` is still the file `catalogued` describes (its stamp, when known, and size).
// Errors: Corruption naming the path and what changed — another file there now, another size,
// another modification time — and saying to open the checkpoint again.
Status CheckUnchanged(const File& file, const CheckpointFile& catalogued);
// The same check of `file` as it is now (an fstat of its descriptor), not as it was opened: for
// a mapped file, whose bytes are read on touch long after the open. Errors: as CheckUnchanged;
// IOError when it cannot be stat'ed.
Status CheckUnchangedNow(const File& file, const CheckpointFile& catalogued);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FILE_H_
