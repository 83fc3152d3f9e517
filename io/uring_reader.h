// UringReader: the fast Reader backend, on io_uring (liburing).
//
// One ring, driven by one thread that the reader owns (the only thread that ever submits, so
// the kernel's per-task async workers live exactly as long as the reader). Requests are cut
// into pieces of at most options.max_chunk bytes; at most options.queue_depth pieces are in
// the kernel, the rest wait in submission order. Each file is opened twice — the caller's
// buffered descriptor and, where the file system allows, an O_DIRECT twin — and each piece goes
// to whichever suits its alignment (see io/reader.h). Files, and the bounce buffers, are
// registered with the ring when the kernel lets us; Describe() says what is in use.
//
// Thread safety: as Reader. Completions are posted by the ring thread to completion_fd().
// Destruction cancels, then waits until the kernel has returned every piece.
// A ring that refuses a submission with anything but EAGAIN, EBUSY or EINTR is broken for
// good: every read the kernel has not taken fails with an IOError saying so (its buffers were
// never handed over), the pieces it took are waited for, and later reads fail at once.
#ifndef LOADSTONE_IO_URING_READER_H_
#define LOADSTONE_IO_URING_READER_H_

#include <memory>
#include <vector>

#include "io/file.h"
#include "io/reader.h"

namespace loadstone::io {

class UringReader final : public Reader {
 public:
  // OK when an io_uring ring can be created here and supports IORING_OP_READ; otherwise an
  // Unsupported status saying why (no kernel support, disabled by sysctl or seccomp, memlock).
  static Status Probe();

  // Takes the open files and starts the ring thread.
  // Errors: InvalidArgument for bad options; Unsupported / IOError when the ring cannot be set up.
  static Result<std::unique_ptr<UringReader>> Create(std::vector<File> files,
                                                     const ReaderOptions& options);
  ~UringReader() override;

  std::string Describe() const override;
  void Submit(std::span<const ReadRequest> requests) override;
  size_t Reap(std::vector<ReadCompletion>* out) override;
  int completion_fd() const override;
  size_t pending() const override;
  void Cancel() override;
  ReaderStats stats() const override;
  bool ReadsDirect(uint32_t file, uint64_t offset, uint64_t length) const override;
  const std::byte* CachedView(uint32_t file, uint64_t offset, uint64_t length) const override;
  Result<uint64_t> SizeNow(uint32_t file) const override;

 private:
  struct Impl;
  explicit UringReader(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_URING_READER_H_
