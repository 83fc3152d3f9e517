// The read stage of one load: the only code that issues its reads. It owns the read window (the
// reader, reads issued in plan order under a limit: read_window.h), each read's record and the
// route it takes at its turn (chunk_table.h), the staging pool (staging_pool.h; a slot is taken by
// one staged read and released once, after the read's last part is placed) and the workers'
// page-cache copies. A read that is back goes on by its route: in place or copied from the page
// cache, its tensors advance; mapped, they advance as it is issued; staged, the placement stage
// takes it (LoadLink::Staged). Used on the load's event loop, except CopyCached and the slots'
// preparation, which run on a worker, and what a worker that holds a read asks of it
// (StagedBytes, ReadDestination, chunks()'s Label, Args and Error, CheckFileSize).
#ifndef LOADSTONE_RUNTIME_PIPELINE_READ_STAGE_H_
#define LOADSTONE_RUNTIME_PIPELINE_READ_STAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "io/reader.h"
#include "loadstone/loader.h"
#include "runtime/pipeline/chunk_table.h"
#include "runtime/pipeline/host_buffer.h"
#include "runtime/pipeline/load_hooks.h"
#include "runtime/pipeline/load_link.h"
#include "runtime/pipeline/read_window.h"
#include "runtime/pipeline/staging_pool.h"

namespace loadstone::pipeline {

class ReadStage {
 public:
  // `options` and `hooks` outlive the stage (the load's).
  // `hub_cache`: LoadOptions::hub_cache, handed to the reader (io::ReaderOptions::hub_cache).
  ReadStage(const StageContext& context, const LoaderOptions& options, const LoadHooks& hooks,
            std::optional<std::string> hub_cache);

  // At the load's start, in this order: the reader (LoaderOptions' backend, queue depth, direct
  // I/O), whose description is returned for the backend line; each read's route for this load
  // (RouteAtStart: fresh pages? O_DIRECT? copies from a mapping guarded?); the staging pool,
  // sized for the largest read that may be staged (its slots pinned by the first GPU's staging
  // when the load has one).
  Result<std::string> Open();
  void SettleRoutes();
  void SizeStaging();

  // Issues the plan's next reads while there is room (reads in flight, free staging slots,
  // workers for page-cache copies); the scheduler's, on every event.
  void Pump();
  // Calls `handler` on the loop once reads may be back (ReadWindow::Arm); then OnCompletions
  // hands each on by its route.
  void Arm(std::function<void(const asio::error_code&)> handler) {
    window_.Arm(std::move(handler));
  }
  void OnCompletions();

  // The staged bytes of read `id` (at its file offset's phase in its slot). REQUIRES: staged.
  const std::byte* StagedBytes(uint64_t id) const;
  // Where an unstaged read lands, and where a shared-buffer read's bytes are placed: its (first)
  // tensor's memory at the read's offset in it.
  std::byte* ReadDestination(uint64_t id) const;
  // A staged read's parts being placed: one more, one done (its slot released after the last).
  void AddPart(uint64_t id) { ++chunks_[id].parts_left; }
  void PartDone(uint64_t id);
  const ChunkTable& chunks() const { return chunks_; }

  // Corruption naming the file and the first tensor past its end when file `file` no longer has
  // the size it had when the checkpoint was opened (`needed` == 0) or is shorter than `needed`:
  // the file the reader opened once it is open (not whatever its path names now), else the path.
  Status CheckFileSize(uint32_t file, uint64_t needed) const;

  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }  // any thread
  // Nothing of this stage in flight: no read, no page-cache copy, no slot being prepared.
  bool idle() const;
  void Cancel() { window_.Cancel(); }  // reads in flight end with Cancelled
  // Reads `ids` (ascending) go next, ahead of the plan's order (LoadHandle::Prioritize).
  void Prioritize(const std::vector<uint64_t>& ids) { window_.Prioritize(ids); }
  // The reader writes the Hub cache (LoadOptions::hub_cache) and is open.
  bool caching() const { return caching_ && window_.open(); }
  // After a load whose every tensor is in place (REQUIRES: idle(); nothing else touches this
  // stage until it returns): the reader completes what it keeps of the reads (io::Reader::Finish:
  // the Hub cache, fetching its gaps and syncing it), and says so. It blocks on the network and
  // the disk, so it runs on a worker, never on the loop.
  std::string FinishCache() { return window_.Finish(); }
  // At the load's end (REQUIRES: idle()): the reader's figures and the routes taken, with what
  // FinishCache said (`cache`), the ring and the files closed now; nothing when the reader never
  // opened. FreeStaging: every slot.
  std::optional<ReadStats> Close(uint64_t conversions_moved, std::string cache);
  void FreeStaging() { staging_.Clear(); }

 private:
  // Takes a free staging slot (allocating it on first use) for read `id` and points `request`
  // at the whole pages around the read, in it. REQUIRES: a free slot.
  Status TakeStagingSlot(uint64_t id, io::ReadRequest* request);
  // Gives read `id`'s staging slot back to the pool: the one place a slot is released, once
  // (the read's record holds the slot's index until then).
  void ReleaseSlot(uint64_t id);
  // Host staging: the workers allocate the slots staging_ hands out, and first-touch them when
  // `touch` (a read that fills most of a slot would otherwise fault it in on the ring thread,
  // with O_DIRECT).
  void PrepareSlots(bool touch);
  void OnSlotPrepared(size_t slot, Result<std::shared_ptr<std::byte>> buffer);
  void OnReadDone(uint64_t id, Status status);
  void CopyCached(uint64_t id, const std::byte* source);  // runs on a worker thread
  void OnCachedDone(uint64_t id, Status status);
  // OK when mapped file `file` is, now, the file the catalog describes (Destinations::
  // CheckMapped); else Corruption naming it and, when its size changed, the first tensor past
  // its end.
  Status CheckMappedFile(uint32_t file) const;
  // Read `id`'s tensors' memory, made before its first byte is read (a shared buffer once).
  Status EnsureDestinations(uint64_t id);

  const StageContext context_;
  const LoaderOptions& options_;
  const LoadHooks& hooks_;
  const std::optional<std::string> hub_cache_;
  bool caching_ = false;    // the reader was given hub_cache_ (Open)
  std::string cache_note_;  // ReadStats::cache when the reader was not: why
  ReadWindow window_;
  StagingPool staging_;
  ChunkTable chunks_;  // one record per plan.reads entry, and the routes taken
  size_t cached_copies_ = 0;  // page-cache copies on the workers (CopyCached)
  bool first_read_back_ = false;  // LoadStage::kMidStream asked
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_READ_STAGE_H_
