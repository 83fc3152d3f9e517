// Aligned host allocations for destination tensors and staging, with a byte budget.
#ifndef LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_
#define LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "loadstone/status.h"

namespace loadstone::pipeline {

inline constexpr size_t kHostAlignment = 4096;  // page: fits O_DIRECT and 64-byte SIMD loads

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

// A page-aligned buffer of `bytes` (at least one page is reserved for 0 bytes), freed when the
// last shared_ptr goes. The budget must outlive the buffer. Errors: OutOfMemory.
Result<std::shared_ptr<std::byte>> AllocateHost(uint64_t bytes,
                                                std::shared_ptr<HostMemoryBudget> budget);

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_HOST_BUFFER_H_
