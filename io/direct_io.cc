#include "io/direct_io.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace loadstone::io {
namespace {

constexpr uint64_t kAssumedAlign = 4096;
constexpr uint64_t kPage = 4096;

// cachestat(2), Linux 6.5; the number is the same on every architecture. The structs are
// declared here because Debian 12's kernel headers predate them.
constexpr long kCachestatSyscall = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
std::atomic<bool> cachestat_missing{false};

// Pages of [offset, offset + length) in the cache, or -1 without cachestat(2).
int64_t CachestatPages(int fd, uint64_t offset, uint64_t length) {
  if (cachestat_missing.load(std::memory_order_relaxed)) return -1;
  CachestatRange range{offset, length};
  Cachestat stat{};
  if (::syscall(kCachestatSyscall, fd, &range, &stat, 0) == 0) {
    return static_cast<int64_t>(stat.nr_cache);
  }
  if (errno == ENOSYS) cachestat_missing.store(true, std::memory_order_relaxed);
  return -1;
}

}  // namespace

void DisableReadahead(const File& file) {
  ::posix_fadvise(file.fd(), 0, 0, POSIX_FADV_RANDOM);  // advice only: failure changes nothing
}

CacheProbe::CacheProbe(const File& file) : fd_(file.fd()), size_(file.size()) {
  if (size_ == 0) return;
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map != MAP_FAILED) map_ = map;
}

CacheProbe::~CacheProbe() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

CacheProbe::CacheProbe(CacheProbe&& other) noexcept
    : fd_(other.fd_), size_(other.size_), map_(std::exchange(other.map_, nullptr)) {}

double CacheProbe::CachedFraction(uint64_t offset, uint64_t length) const {
  if (length == 0) return 1.0;
  const uint64_t first = offset / kPage, last = (offset + length - 1) / kPage;
  const double pages = static_cast<double>(last - first + 1);
  const int64_t cached = CachestatPages(fd_, first * kPage, (last - first + 1) * kPage);
  if (cached >= 0) return std::min(1.0, cached / pages);
  if (map_ == nullptr || first * kPage >= size_) return 0;
  const uint64_t end = std::min((last + 1) * kPage, (size_ + kPage - 1) / kPage * kPage);
  std::vector<unsigned char> resident((end - first * kPage) / kPage);
  if (::mincore(static_cast<std::byte*>(map_) + first * kPage, end - first * kPage,
                resident.data()) != 0) {
    return 0;
  }
  return std::count_if(resident.begin(), resident.end(), [](unsigned char v) { return v & 1; }) /
         pages;
}

const std::byte* CacheProbe::CachedView(uint64_t offset, uint64_t length) const {
  if (map_ == nullptr || offset > size_ || length > size_ - offset ||
      CachedFraction(offset, length) < kMostlyCached) {
    return nullptr;
  }
  return static_cast<const std::byte*>(map_) + offset;
}

DirectTwin OpenDirectTwin(const File& buffered) {
  DirectTwin twin;
  struct statfs fs;
  if (::fstatfs(buffered.fd(), &fs) == 0 &&
      (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
    twin.why_not = "in-memory file system";
    return twin;
  }
  uint64_t align = kAssumedAlign;
  struct statx sx;
  std::memset(&sx, 0, sizeof sx);
  if (::statx(buffered.fd(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0) {
    if (sx.stx_dio_offset_align == 0) {
      twin.why_not = "the file system does not support O_DIRECT for it";
      return twin;
    }
    align = std::max<uint64_t>(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
  Result<File> direct = File::OpenForRead(buffered.path(), O_DIRECT);
  if (!direct.ok()) {
    twin.why_not = std::string(direct.status().message());
    return twin;
  }
  // Opened by path again: it must still name the file the buffered descriptor reads.
  if (!direct->stamp().SameFile(buffered.stamp())) {
    twin.why_not = "the file was replaced while it was opened";
    return twin;
  }
  twin.file = std::move(direct).value();
  twin.align = align;
  return twin;
}

void BouncePool::Free::operator()(std::byte* p) const { std::free(p); }

BouncePool::BouncePool(size_t count, uint64_t slot_bytes, uint64_t align) {
  if (count == 0 || slot_bytes == 0 || align == 0 || slot_bytes % align != 0) return;
  void* memory = std::aligned_alloc(align, count * slot_bytes);
  if (memory == nullptr) return;
  memory_.reset(static_cast<std::byte*>(memory));
  slot_bytes_ = slot_bytes;
  count_ = count;
  free_.reserve(count);
  for (size_t i = count; i > 0; --i) free_.push_back(static_cast<int>(i - 1));
}

int BouncePool::Acquire() {
  if (free_.empty()) return -1;
  int slot = free_.back();
  free_.pop_back();
  return slot;
}

}  // namespace loadstone::io

namespace loadstone {

Result<double> CachedFraction(const std::string& path) {
  LOADSTONE_ASSIGN_OR_RETURN(const io::File file, io::File::OpenForRead(path));
  return io::CacheProbe(file).CachedFraction(0, file.size());
}

}  // namespace loadstone
