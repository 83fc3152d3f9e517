// Aligned host allocations for destination tensors and staging, with a byte budget.
#ifndef LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_
#define LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "loadstone/plan.h"
#include "loadstone/status.h"

namespace loadstone::pipeline {

inline constexpr size_t kHostAlignment = 4096;  // page: fits O_DIRECT and 64-byte SIMD loads
inline constexpr size_t kHugePage = 2 << 20;

// Fresh destinations use normal pages. Huge pages are for memory that is reused, like staging:
// on this kind of VM a huge page's first touch costs more than 512 small ones (the host backs
// it at once) and, with defrag=madvise, may compact memory; once touched, O_DIRECT into it
// goes out as large device requests (physically contiguous), 1.7 MiB on average vs 0.5 MiB.
enum class HostPages { kNormal, kHuge };

// Counts bytes handed out; Allocate fails past `limit` (0 = no limit). Thread-safe.
class HostMemoryBudget {
 public:
  explicit HostMemoryBudget(uint64_t limit) : limit_(limit) {}
  bool Take(uint64_t bytes);
  void Give(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// Takes `bytes` from `budget` (none: nothing to take). Errors: OutOfMemory saying how much is in
// use, and what to do.
Status TakeHostBudget(HostMemoryBudget* budget, uint64_t bytes);

// A page-aligned buffer of `bytes` (at least one page is reserved for 0 bytes), freed when the
// last shared_ptr goes. kHuge: 2 MiB aligned and rounded, advised MADV_HUGEPAGE (advice only:
// where the kernel says no, it is normal pages). The budget must outlive the buffer.
// Errors: OutOfMemory.
Result<std::shared_ptr<std::byte>> AllocateHost(uint64_t bytes,
                                                std::shared_ptr<HostMemoryBudget> budget,
                                                HostPages pages = HostPages::kNormal);

// Small host tensors share blocks: one allocation of kBlock bytes holds many 64-byte-aligned
// tensors, instead of a page (and an allocator round trip) each. A block is freed when the last
// tensor in it is. Not thread-safe: one load's destinations are allocated on its loop thread.
class SmallTensorArena {
 public:
  static constexpr uint64_t kBlock = 4ULL << 20;
  static constexpr uint64_t kAlignment = 64;
  // Tensors below this share blocks; larger ones get their own allocation.
  static constexpr uint64_t kLargest = kArenaTensorMax;

  explicit SmallTensorArena(std::shared_ptr<HostMemoryBudget> budget) : budget_(std::move(budget)) {}

  // REQUIRES: bytes < kLargest. Errors: OutOfMemory (a new block past the budget).
  Result<std::shared_ptr<std::byte>> Allocate(uint64_t bytes);

 private:
  std::shared_ptr<HostMemoryBudget> budget_;
  std::shared_ptr<std::byte> block_;
  uint64_t used_ = kBlock;  // of block_; kBlock: none yet
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_
