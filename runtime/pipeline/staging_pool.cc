#include "runtime/pipeline/staging_pool.h"

#include "runtime/pipeline/host_buffer.h"

namespace loadstone::pipeline {

void StagingPool::Reset(uint64_t slot_bytes, size_t slots, std::shared_ptr<device::Accelerator> device) {
  slot_bytes_ = slot_bytes;
  device_ = std::move(device);
  slots_.assign(slots, nullptr);
  taken_.assign(slots, false);
  free_.clear();
  unprepared_.clear();
  // Device staging is allocated on first use; host staging is prepared by the workers.
  auto& initial = device_ ? free_ : unprepared_;
  for (size_t i = slots; i > 0; --i) initial.push_back(i - 1);
}

Result<size_t> StagingPool::Take(std::string* note) {
  const size_t s = free_.back();
  if (!slots_[s]) {
    LOADSTONE_ASSIGN_OR_RETURN(device::HostStaging staging, device_->AllocateStaging(slot_bytes_));
    if (!staging.pinned && !noted_pageable_) {
      noted_pageable_ = true;
      *note = "staging is pageable (" + staging.why_pageable + ")";
    }
    slots_[s] = std::move(staging.data);
  }
  free_.pop_back();
  taken_[s] = true;
  return s;
}

bool StagingPool::Release(size_t slot) {
  if (slot >= taken_.size() || !taken_[slot]) return false;
  taken_[slot] = false;
  free_.push_back(slot);
  return true;
}

// Host staging slots are huge pages whose first touch is slow on some VMs (a host that had taken
// the memory back; bench/README.md). Touched by the O_DIRECT submission, that
// time was spent on the ring thread before the first reads went out; two workers touch them
// in parallel instead, and each slot joins the pool as soon as it is ready. Slots wanted by a
// small read (a few coalesced small tensors) are not touched ahead: such reads fill a small
// part of a slot, and touching all of it cost 200 MiB of RSS on a warm load.
std::vector<size_t> StagingPool::StartPreparing() {
  constexpr size_t kAtOnce = 2;
  std::vector<size_t> out;
  while (!unprepared_.empty() && preparing_ < kAtOnce) {
    out.push_back(unprepared_.back());
    unprepared_.pop_back();
    ++preparing_;
  }
  return out;
}

Result<std::shared_ptr<std::byte>> StagingPool::AllocateHostSlot(uint64_t bytes, bool touch) {
  auto buffer = AllocateHost(bytes, nullptr, HostPages::kHuge);
  if (buffer.ok() && touch) {
    for (uint64_t at = 0; at < bytes; at += kHostAlignment) buffer->get()[at] = std::byte{0};
  }
  return buffer;
}

void StagingPool::Prepared(size_t slot, std::shared_ptr<std::byte> buffer) {
  --preparing_;
  slots_[slot] = std::move(buffer);
  free_.push_back(slot);
}

void StagingPool::Dropped() { --preparing_; }

void StagingPool::Clear() {
  slots_.clear();
  taken_.clear();
  free_.clear();
  unprepared_.clear();
}

}  // namespace loadstone::pipeline
