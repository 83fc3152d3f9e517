#include "runtime/pipeline/host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>

#include <fmt/format.h>

namespace loadstone::pipeline {

bool HostMemoryBudget::Take(uint64_t bytes) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (limit_ != 0 && used + bytes > limit_) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

Status TakeHostBudget(HostMemoryBudget* budget, uint64_t bytes) {
  if (budget == nullptr || budget->Take(bytes)) return Status::OK();
  return Status::OutOfMemory(fmt::format(
      "host memory limit reached: {} more bytes wanted, {} in use (raise the limit or load "
      "less)", bytes, budget->used()));
}

Result<std::shared_ptr<std::byte>> AllocateHost(uint64_t bytes,
                                                std::shared_ptr<HostMemoryBudget> budget,
                                                HostPages pages) {
  const uint64_t align = pages == HostPages::kHuge ? kHugePage : kHostAlignment;
  const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + align - 1) / align * align;
  LOADSTONE_RETURN_IF_ERROR(TakeHostBudget(budget.get(), rounded));
  void* p = std::aligned_alloc(align, rounded);
  if (p != nullptr && pages == HostPages::kHuge) ::madvise(p, rounded, MADV_HUGEPAGE);
  if (p == nullptr) {
    if (budget) budget->Give(rounded);
    return Status::OutOfMemory(fmt::format("cannot allocate {} bytes of host memory", rounded));
  }
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [budget, rounded](std::byte* q) {
    std::free(q);
    if (budget) budget->Give(rounded);
  });
}

Result<std::shared_ptr<std::byte>> SmallTensorArena::Allocate(uint64_t bytes) {
  const uint64_t size = std::max<uint64_t>(bytes, 1);
  const uint64_t at = (used_ + kAlignment - 1) / kAlignment * kAlignment;
  if (at + size > kBlock) {
    LOADSTONE_ASSIGN_OR_RETURN(block_, AllocateHost(kBlock, budget_));
    used_ = 0;
    return Allocate(bytes);
  }
  used_ = at + size;
  return std::shared_ptr<std::byte>(block_, block_.get() + at);  // aliasing: keeps the block
}

}  // namespace loadstone::pipeline
