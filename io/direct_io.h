// O_DIRECT support for the readers: finding out whether a file can be read with O_DIRECT (and
// with which alignment), how much of a range already sits in the page cache (where a copy
// from the cache beats reading the device again), and a pool of aligned bounce buffers.
#ifndef LOADSTONE_IO_DIRECT_IO_H_
#define LOADSTONE_IO_DIRECT_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/file.h"
#include "loadstone/diagnostics.h"

namespace loadstone::io {

// An O_DIRECT descriptor of an already open file, or why there is none.
struct DirectTwin {
  File file;           // open with O_DIRECT when align > 0
  uint64_t align = 0;  // offset, length and address alignment O_DIRECT needs; 0: none
  std::string why_not;
};

// Opens `buffered`'s path again with O_DIRECT when its file system really bypasses the page
// cache: not on in-memory file systems (tmpfs, ramfs — they accept the flag but have nothing
// to bypass), and only when statx reports direct-I/O alignment for the file (or, on kernels
// without STATX_DIOALIGN, when the open succeeds; 4096 is then assumed).
DirectTwin OpenDirectTwin(const File& buffered);

// Turns off kernel readahead on `file`'s descriptor (POSIX_FADV_RANDOM). The readers ask for
// large explicit ranges, several at once; on one shared descriptor the readahead heuristics
// then fight each other, costing both rate and CPU (bench/README.md, reader_bench).
void DisableReadahead(const File& file);

// A range this much in the page cache is copied from there instead of read from the device
// (loadstone::kMostlyCached, diagnostics.h).
inline constexpr double kMostlyCached = loadstone::kMostlyCached;

// Tells how much of a file range is in the page cache: cachestat(2) on Linux 6.5+, mincore(2)
// on a read-only mapping of the file before that. Holds that mapping either way (CachedView).
// Thread-compatible (const methods only).
class CacheProbe {
 public:
  explicit CacheProbe(const File& file);
  ~CacheProbe();
  CacheProbe(CacheProbe&& other) noexcept;
  CacheProbe& operator=(CacheProbe&&) = delete;
  CacheProbe(const CacheProbe&) = delete;
  CacheProbe& operator=(const CacheProbe&) = delete;

  // The share of the pages of [offset, offset + length) that are cached, 0..1 (0 when it
  // cannot be told).
  double CachedFraction(uint64_t offset, uint64_t length) const;

  // Where the range's bytes are in a read-only shared mapping of the whole file, when at least
  // kMostlyCached of its pages are in the page cache (and the file could be mapped); else
  // nullptr. Touching a page that cannot be read raises SIGBUS: see Reader::CachedView.
  const std::byte* CachedView(uint64_t offset, uint64_t length) const;

 private:
  int fd_;
  uint64_t size_;
  void* map_ = nullptr;
};

// A fixed set of equally sized, aligned buffers, handed out by index.
// Not thread-safe (the ring thread owns it).
class BouncePool {
 public:
  BouncePool() = default;
  // `count` slots of `slot_bytes` (a multiple of `align`, itself a power of two ≥ 4096), each
  // starting at a multiple of `align`. Empty when the memory cannot be had.
  BouncePool(size_t count, uint64_t slot_bytes, uint64_t align);

  bool empty() const { return slot_bytes_ == 0; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  size_t count() const { return count_; }
  std::byte* data() const { return memory_.get(); }
  uint64_t total_bytes() const { return slot_bytes_ * count(); }

  // A free slot's index, or -1 when all are in use.
  int Acquire();
  void Release(int slot) { free_.push_back(slot); }
  std::byte* slot(int index) const { return memory_.get() + slot_bytes_ * index; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> memory_;
  uint64_t slot_bytes_ = 0;
  size_t count_ = 0;
  std::vector<int> free_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_DIRECT_IO_H_
