// PreadReader: the portable Reader backend — a pool of threads doing pread(2) through the page
// cache. Used where io_uring is unavailable (old kernels, seccomp-filtered containers) or when
// asked for (--backend pread).
//
// Semantics are those of io/reader.h: requests are served in submission order, long ones cut
// into options.max_chunk pieces that the threads read in parallel; short reads are continued,
// EINTR retried, an end of file inside a request is Corruption.
//
// Thread safety: as Reader. Destruction cancels, then waits for the reads in progress.
#ifndef LOADSTONE_IO_PREAD_READER_H_
#define LOADSTONE_IO_PREAD_READER_H_

#include <memory>
#include <vector>

#include "io/file.h"
#include "io/reader.h"

namespace loadstone::io {

class PreadReader final : public Reader {
 public:
  // Takes the open files; starts options.threads threads.
  // Errors: InvalidArgument for bad options, IOError when the eventfd cannot be created.
  static Result<std::unique_ptr<PreadReader>> Create(std::vector<File> files,
                                                     const ReaderOptions& options);
  ~PreadReader() override;

  std::string Describe() const override;
  void Submit(std::span<const ReadRequest> requests) override;
  size_t Reap(std::vector<ReadCompletion>* out) override;
  int completion_fd() const override;
  size_t pending() const override;
  void Cancel() override;
  ReaderStats stats() const override;
  const std::byte* CachedView(uint32_t file, uint64_t offset, uint64_t length) const override;
  Result<uint64_t> SizeNow(uint32_t file) const override;

 private:
  struct Impl;
  explicit PreadReader(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_PREAD_READER_H_
