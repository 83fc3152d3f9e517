// Destination memory filled without the kernel zeroing it first (userfaultfd's UFFDIO_COPY).
//
// A CPU load writes every byte of gigabytes of memory that the process has never touched. Written
// the usual way, each 4 KiB page faults, the kernel zeroes it, and the copy then overwrites it:
// the zeroing was most of a warm load's time here (`perf`: clear_page_erms 53%). Registered with a
// userfaultfd, a never-touched page can instead be allocated and filled in one step
// (UFFDIO_COPY, pages batched per call), faster than pread or memcpy out of an mmap into the
// same fresh memory (bench/README.md, "Fresh pages").
//
// Contract of a buffer from Allocate, until the FreshPages that made it is destroyed: its pages
// are filled only through Write/WriteConverted, and nothing else touches a page before it is
// filled (a read of a missing page from user space would wait for this object's destruction,
// which unregisters everything; from the kernel, e.g. an io_uring read, it fails with EFAULT).
// The pipeline keeps this: a tensor is handed out only once all of it is written, and such
// buffers are filled by the workers only, never read into by the reader.
#ifndef LOADSTONE_RUNTIME_PIPELINE_FRESH_PAGES_H_
#define LOADSTONE_RUNTIME_PIPELINE_FRESH_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "loadstone/status.h"
#include "runtime/pipeline/host_buffer.h"

namespace loadstone::pipeline {

class FreshPages {
 public:
  // A userfaultfd for this process (UFFD_USER_MODE_ONLY where the kernel has it, so that it needs
  // no privilege). Errors: Unsupported with the reason (no kernel support, a seccomp filter,
  // vm.unprivileged_userfaultfd = 0 on kernels before 5.11).
  static Result<std::unique_ptr<FreshPages>> Open();
  ~FreshPages();  // unregisters every buffer; they stay valid (their owners free them)
  FreshPages(const FreshPages&) = delete;
  FreshPages& operator=(const FreshPages&) = delete;

  // A page-aligned anonymous mapping of `bytes` (rounded up to pages), registered for filling.
  // Errors: OutOfMemory (the budget or the kernel said no), IOError (registration refused).
  Result<std::shared_ptr<std::byte>> Allocate(uint64_t bytes,
                                              std::shared_ptr<HostMemoryBudget> budget) const;

  // Copies `bytes` from `src` to `dst`, inside one buffer from Allocate. Pages wholly inside
  // [dst, dst + bytes) must not have been written yet; they go in by UFFDIO_COPY. A page shared
  // with another write (the range starts or ends inside it) is made present first and then
  // memcpy'd, so writes of neighbouring ranges may run concurrently. Thread-safe.
  // Errors: OutOfMemory, IOError (the source could not be read, e.g. EFAULT).
  Status Write(std::byte* dst, const std::byte* src, uint64_t bytes) const;

  // Writes `bytes` produced by `produce(out, offset, n)` (fills out[0, n) with the bytes at
  // `offset` of the range) through a per-thread scratch block, so that a conversion writes into
  // cache and the fresh pages are filled by Write. Blocks end on page boundaries: when `dst` is
  // a whole number of elements past a page boundary (and elements divide 4096), every block is
  // a whole number of elements.
  Status WriteConverted(std::byte* dst, uint64_t bytes,
                        const std::function<Status(std::byte* out, uint64_t offset, uint64_t n)>&
                            produce) const;

  // The scratch block WriteConverted produces into, in bytes.
  static constexpr uint64_t kScratchBytes = 256 << 10;

 private:
  explicit FreshPages(int fd) : fd_(fd) {}
  Status CopyPages(uint64_t dst, uint64_t src, uint64_t bytes) const;
  Status FillPartialPage(std::byte* dst, const std::byte* src, uint64_t bytes) const;

  int fd_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_FRESH_PAGES_H_
