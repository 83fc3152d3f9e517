// Where each tensor's memory comes from, for one load: its device, a private mapping of its file
// (mmap), fresh pages the workers fill (fresh_pages.h), its read's shared buffer
// (ReadChunk::shared_buffer), the small-tensor arena (small converted tensors), or a host buffer
// in phase with the file for O_DIRECT. Host memory given out is counted against the load's
// budget (LoadOptions::host_memory_limit). Set up at the load's start and then used on its
// event-loop thread, except Fresh() and fresh_pages(), which the workers read.
#ifndef LOADSTONE_RUNTIME_PIPELINE_DESTINATIONS_H_
#define LOADSTONE_RUNTIME_PIPELINE_DESTINATIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/file.h"
#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "runtime/device/accelerator.h"
#include "runtime/pipeline/fresh_pages.h"
#include "runtime/pipeline/host_buffer.h"

namespace loadstone::pipeline {

class Destinations {
 public:
  // Memory for a tensor (or a shared block): `data` inside what `owner` keeps alive.
  struct Memory {
    std::shared_ptr<std::byte> owner;
    std::byte* data = nullptr;
  };

  using CallerMemory = std::function<std::span<std::byte>(const TensorInfo&, const TensorPlan&)>;

  // `caller_memory`: LoadOptions::destination, for the plan's TensorPlan::caller_memory tensors.
  Destinations(const Checkpoint& checkpoint, const LoadPlan& plan, const device::DeviceSet& devices,
               uint64_t host_memory_limit, bool direct_io, CallerMemory caller_memory);

  // The start's steps. Resolve: each plan target to one of `devices` (InvalidArgument naming the
  // first tensor planned on a device this Loader does not have; `device_log` says what it has).
  // Tensors planned pinned need a GPU: Unsupported when the Loader has none.
  Status Resolve(const std::string& device_log);
  // The backend line's note on pinned CPU tensors (empty when none are planned).
  std::string PinnedNote() const;
  Status MapFiles();  // ReadRouteOptions::mmap: every file mapped privately
  // OK when mapped file `file` is still, now, the file the catalog describes (io::
  // CheckUnchangedNow on the descriptor that was mapped): a mapped tensor's bytes are the file's,
  // read on touch, so one that shrank or was rewritten since would hand out zeros or other bytes.
  // Errors: Corruption naming the file and what changed. REQUIRES: MapFiles() succeeded.
  Status CheckMapped(uint32_t file) const;
  void CloseMappedFiles();  // once no tensor will be counted any more (the mappings stay)
  // Opens fresh pages when some tensor wants them (`refuse`: as if userfaultfd were refused);
  // the backend line's note (empty when none do).
  std::string OpenFreshPages(bool refuse = false);
  void CloseFreshPages();  // once nothing writes tensors any more: unregisters their pages

  // The index into `devices` of tensor `t`'s device, -1 for the CPU.
  int DeviceOf(uint32_t t) const { return target_device_[plan_.tensors[t].device]; }
  // The device whose pinned staging the load uses (its first GPU), or null.
  const std::shared_ptr<device::Accelerator>& staging_device() const { return staging_device_; }
  // Tensor `t` is written into fresh pages, by the workers only.
  bool Fresh(uint32_t t) const { return fresh_ != nullptr && plan_.tensors[t].fresh_pages; }
  bool has_fresh_pages() const { return fresh_ != nullptr; }
  const FreshPages& fresh_pages() const { return *fresh_; }  // REQUIRES: some Fresh(t)

  // Memory for tensor `t`, of the kind its plan chose (TensorPlan::memory; MemoryAtStart's one
  // departure, routes.h). Errors: OutOfMemory (budget, device), IOError, the caller's
  // destination's (FromCaller).
  Result<Memory> ForTensor(uint32_t t);
  // The one buffer of a shared-buffer read: its bytes as the file has them, in phase with the
  // file for O_DIRECT unless fresh pages. Errors: as ForTensor.
  Result<Memory> ForSharedRead(const ReadChunk& read);

 private:
  // Tensor `src`'s memory from LoadOptions::destination (TensorPlan::caller_memory), checked:
  // InvalidArgument without a destination or for a span of another size, CallbackFailed when
  // it throws.
  Result<Memory> FromCaller(const TensorInfo& src, const TensorPlan& tp) const;
  // `bytes` (+ `skew` before them) of pin_device_'s pinned host memory. Errors: OutOfMemory
  // (budget; the driver would not pin).
  Result<Memory> Pinned(uint64_t bytes, uint64_t skew);

  // How far into its first page memory for bytes at file offset `offset` starts, so that
  // O_DIRECT reads land in it in one piece: the offset's phase, or 0 without direct I/O.
  uint64_t InPhaseSkew(uint64_t offset) const { return direct_io_ ? offset % kHostAlignment : 0; }

  const Checkpoint& checkpoint_;
  const LoadPlan& plan_;
  const device::DeviceSet& devices_;
  const bool direct_io_;
  const CallerMemory caller_memory_;
  std::shared_ptr<HostMemoryBudget> budget_;
  SmallTensorArena small_tensors_;
  std::vector<int> target_device_;  // per plan.targets entry: index into devices_, -1 for cpu
  std::shared_ptr<device::Accelerator> staging_device_;
  // Whose pinned host memory TensorPlan::pinned tensors get: the staging device, else the
  // Loader's first GPU; null when none are planned.
  std::shared_ptr<device::Accelerator> pin_device_;
  std::unique_ptr<FreshPages> fresh_;
  std::vector<std::shared_ptr<void>> mappings_;  // one per file in mmap mode
  std::vector<io::File> mapped_files_;           // what each mapping maps, until the load ends
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_DESTINATIONS_H_
