#include "runtime/pipeline/fresh_pages.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "io/posix_error.h"

namespace loadstone::pipeline {
namespace {

constexpr uint64_t kPage = kHostAlignment;

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

int OpenUserfaultfd() {
#ifdef UFFD_USER_MODE_ONLY
  // Only faults from user space are ours: needs no privilege on 5.11+ kernels.
  const int fd =
      static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd >= 0 || errno != EINVAL) return fd;
#endif
  return static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
}

}  // namespace

Result<std::unique_ptr<FreshPages>> FreshPages::Open() {
  const int fd = OpenUserfaultfd();
  if (fd < 0) {
    return Status::Unsupported(fmt::format("userfaultfd: {}", std::strerror(errno)));
  }
  uffdio_api api{};
  api.api = UFFD_API;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unsupported(fmt::format("userfaultfd API handshake: {}", std::strerror(err)));
  }
  return std::unique_ptr<FreshPages>(new FreshPages(fd));
}

FreshPages::~FreshPages() { ::close(fd_); }

Result<std::shared_ptr<std::byte>> FreshPages::Allocate(
    uint64_t bytes, std::shared_ptr<HostMemoryBudget> budget) const {
  const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  LOADSTONE_RETURN_IF_ERROR(TakeHostBudget(budget.get(), rounded));
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    if (budget) budget->Give(rounded);
    return Status::OutOfMemory(fmt::format("cannot map {} bytes of host memory", rounded));
  }
  uffdio_register reg{};
  reg.range = {Addr(p), rounded};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  const uint64_t needed = (1ULL << _UFFDIO_COPY) | (1ULL << _UFFDIO_ZEROPAGE);
  if (::ioctl(fd_, UFFDIO_REGISTER, &reg) != 0 || (reg.ioctls & needed) != needed) {
    const int err = errno;
    ::munmap(p, rounded);
    if (budget) budget->Give(rounded);
    return io::ErrnoStatus(err, fmt::format("registering {} bytes with userfaultfd", rounded));
  }
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [budget, rounded](std::byte* q) {
    ::munmap(q, rounded);
    if (budget) budget->Give(rounded);
  });
}

Status FreshPages::Write(std::byte* dst, const std::byte* src, uint64_t bytes) const {
  uint64_t at = Addr(dst);
  const uint64_t end = at + bytes;
  if (at % kPage != 0 && at < end) {
    const uint64_t n = std::min(end, (at / kPage + 1) * kPage) - at;
    LOADSTONE_RETURN_IF_ERROR(FillPartialPage(dst, src, n));
    at += n;
    src += n;
  }
  const uint64_t whole_end = std::max(at, end / kPage * kPage);
  if (at < whole_end) {
    LOADSTONE_RETURN_IF_ERROR(CopyPages(at, Addr(src), whole_end - at));
    src += whole_end - at;
    at = whole_end;
  }
  if (at < end) return FillPartialPage(reinterpret_cast<std::byte*>(at), src, end - at);
  return Status::OK();
}

// A page another write may share: whoever comes first maps the zero page (the other sees
// EEXIST), and both then write their bytes as into any present page.
Status FreshPages::FillPartialPage(std::byte* dst, const std::byte* src, uint64_t bytes) const {
  uffdio_zeropage zero{};
  zero.range = {Addr(dst) / kPage * kPage, kPage};
  while (::ioctl(fd_, UFFDIO_ZEROPAGE, &zero) != 0 && errno != EEXIST) {
    if (errno != EAGAIN && errno != EINTR) {
      return io::ErrnoStatus(errno, fmt::format("filling the page at {:#x}", zero.range.start));
    }
  }
  std::memcpy(dst, src, bytes);
  return Status::OK();
}

Status FreshPages::CopyPages(uint64_t dst, uint64_t src, uint64_t bytes) const {
  while (bytes > 0) {
    uffdio_copy copy{};
    copy.dst = dst;
    copy.src = src;
    copy.len = bytes;
    if (::ioctl(fd_, UFFDIO_COPY, &copy) == 0) return Status::OK();
    const int err = errno;
    const uint64_t done = copy.copy > 0 ? static_cast<uint64_t>(copy.copy) : 0;
    dst += done, src += done, bytes -= done;
    if (err == EAGAIN || err == EINTR) continue;  // partly done, or the mm was changing
    if (err == EEXIST) {  // present already (written another way): an ordinary copy will do
      std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), kPage);
      dst += kPage, src += kPage, bytes -= kPage;
      continue;
    }
    return io::ErrnoStatus(
        err, fmt::format("filling {} bytes of fresh pages at {:#x} from {:#x}", bytes, dst, src));
  }
  return Status::OK();
}

Status FreshPages::WriteConverted(
    std::byte* dst, uint64_t bytes,
    const std::function<Status(std::byte* out, uint64_t offset, uint64_t n)>& produce) const {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<std::byte, Free> scratch(
      static_cast<std::byte*>(std::aligned_alloc(kPage, kScratchBytes)));
  if (!scratch) return Status::OutOfMemory("cannot allocate a conversion scratch block");
  for (uint64_t done = 0; done < bytes;) {
    // Blocks end on page boundaries, so that only the range's own ends are shared pages.
    const uint64_t at = Addr(dst) + done;
    const uint64_t n = std::min(Addr(dst) + bytes, at / kPage * kPage + kScratchBytes) - at;
    LOADSTONE_RETURN_IF_ERROR(produce(scratch.get(), done, n));
    LOADSTONE_RETURN_IF_ERROR(Write(dst + done, scratch.get(), n));
    done += n;
  }
  return Status::OK();
}

}  // namespace loadstone::pipeline
