// The staging pool of one load: slots as large as its largest staged read (with whole pages
// around any phase), each in exactly one state — waiting to be prepared, being prepared, free,
// or holding one chunk. Host slots are huge pages that the workers allocate (and first-touch)
// ahead of use; device staging (pinned, from the first GPU the load uses) is allocated on first
// use. Used on the load's event-loop thread only; the caller posts the preparations, since it
// owns the load's lifetime (ReadStage::PrepareSlots).
#ifndef LOADSTONE_RUNTIME_PIPELINE_STAGING_POOL_H_
#define LOADSTONE_RUNTIME_PIPELINE_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loadstone/status.h"
#include "runtime/device/accelerator.h"

namespace loadstone::pipeline {

class StagingPool {
 public:
  // `slots` slots of `slot_bytes`, pinned by `device`'s staging, or host huge pages when null.
  void Reset(uint64_t slot_bytes, size_t slots, std::shared_ptr<device::Accelerator> device);

  uint64_t slot_bytes() const { return slot_bytes_; }
  bool has_free() const { return !free_.empty(); }
  size_t preparing() const { return preparing_; }
  // The slot's memory; valid until Clear(), readable from the workers while the slot is taken.
  std::byte* data(size_t slot) const { return slots_[slot].get(); }

  // A free slot, its device staging allocated on first use; `*note` gets, once, why that
  // staging is pageable when it is. REQUIRES: has_free(). Errors: the device's.
  Result<size_t> Take(std::string* note);
  // Gives a taken slot back; false (and nothing done) for a slot that is not taken.
  bool Release(size_t slot);

  // Host slots to prepare now (at most two in preparation at once): the caller allocates each
  // with AllocateHostSlot on a worker, then reports with Prepared or Dropped.
  std::vector<size_t> StartPreparing();
  // On a worker: a huge-page slot of `bytes`, first-touched when `touch`.
  static Result<std::shared_ptr<std::byte>> AllocateHostSlot(uint64_t bytes, bool touch);
  void Prepared(size_t slot, std::shared_ptr<std::byte> buffer);  // the slot becomes free
  void Dropped();  // a preparation that failed, or that finished after the load stopped

  void Clear();  // frees every slot (nothing may be taken or in preparation)

 private:
  uint64_t slot_bytes_ = 0;
  std::shared_ptr<device::Accelerator> device_;
  std::vector<std::shared_ptr<std::byte>> slots_;
  std::vector<size_t> free_;        // allocated (host: and touched) slots not in use
  std::vector<bool> taken_;         // per slot: holding a chunk (Take .. Release)
  std::vector<size_t> unprepared_;  // host slots not allocated yet
  size_t preparing_ = 0;            // host slots being allocated and touched by workers
  bool noted_pageable_ = false;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_STAGING_POOL_H_
