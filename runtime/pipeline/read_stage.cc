// The read stage (read_stage.h): Pump and its completions on the event loop — the plan's reads
// issued through the read window while there is room, each on the route it takes (routes.h) —
// the staging slots taken, prepared and released, and the workers' page-cache copies.
#include "runtime/pipeline/read_stage.h"

#include <asio/post.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/http_reader.h"
#include "io/location.h"
#include "io/mapped_copy.h"
#include "io/posix_error.h"
#include "runtime/pipeline/destinations.h"
#include "runtime/pipeline/routes.h"
#include "runtime/pipeline/tensor_slots.h"
#include "runtime/pipeline/trace.h"

namespace loadstone::pipeline {
namespace {

io::ReaderBackend ToIo(ReadBackend backend) {
  switch (backend) {
    case ReadBackend::kUring: return io::ReaderBackend::kUring;
    case ReadBackend::kPread: return io::ReaderBackend::kPread;
    case ReadBackend::kAuto: break;
  }
  return io::ReaderBackend::kAuto;
}

// What the reader writes the Hub cache with: the folder ("" for huggingface_hub's), the revision
// the user's hf:// address asked for, the index and config.json read at Open.
io::HubCacheTarget CacheTarget(const Checkpoint& checkpoint, const std::string& root) {
  io::HubCacheTarget target;
  target.root = root.empty() ? io::HubCacheRoot() : root;
  if (io::IsHubAddress(checkpoint.source())) {
    if (auto hub = io::ParseHubAddress(checkpoint.source()); hub.ok()) target.revision = hub->revision;
  }
  for (const std::string& side : {checkpoint.index_path(), checkpoint.config().path}) {
    if (io::IsRemoteAddress(side)) target.side_files.push_back(side);
  }
  return target;
}

}  // namespace

ReadStage::ReadStage(const StageContext& context, const LoaderOptions& options,
                     const LoadHooks& hooks, std::optional<std::string> hub_cache)
    : context_(context),
      options_(options),
      hooks_(hooks),
      hub_cache_(std::move(hub_cache)),
      window_(context.plan.reads.size(), static_cast<size_t>(std::max(options.queue_depth, 1)) * 2),
      chunks_(context.checkpoint, context.plan) {}

Result<std::string> ReadStage::Open() {
  std::vector<std::string> paths;
  for (const CheckpointFile& f : context_.checkpoint.files()) paths.push_back(f.path);
  io::ReaderOptions ro;
  ro.backend = ToIo(options_.backend);
  ro.queue_depth = options_.queue_depth;
  ro.direct = options_.direct_io;
  ro.catalogued = context_.checkpoint.files();
  ro.max_bytes_in_flight = options_.bytes_in_flight;
  // ro.max_chunk stays the reader's default: it splits the plan's reads into the pieces the
  // kernel handles best (io/reader.h).
  // Every read this stage issues lands in phase with its file offset (staging slots and whole
  // pages; in-place buffers allocated at the offset's phase, TensorSlots::Ensure) unless tensors
  // must be 64-byte aligned: only then do O_DIRECT reads need bounce buffers. Without them the
  // reader keeps no pool (no bounced bytes, and its pinned memory saved); a read that is not in
  // phase after all goes through the page cache, and ReadStats says so (buffered_bytes).
  if (!context_.plan.routes.align_tensors) ro.bounce_bytes = 0;
  const auto& files = context_.checkpoint.files();
  if (hub_cache_ && io::IsHubAddress(context_.checkpoint.source()) && !files.empty() &&
      !io::IsRemoteAddress(files[0].path)) {
    // Opened from the Hugging Face cache (OpenOptions::read_hub_cache): it is there already.
    cache_note_ = "nothing to write: read from the Hugging Face cache";
  } else if (hub_cache_) {
    ro.hub_cache = CacheTarget(context_.checkpoint, *hub_cache_);
  }
  caching_ = ro.hub_cache.has_value();
  LOADSTONE_RETURN_IF_ERROR(window_.Open(context_.loop, paths, ro, hooks_.open_reader));
  return window_.reader().Describe();
}

void ReadStage::SettleRoutes() {
  const StartFacts facts{context_.destinations.has_fresh_pages(), options_.direct_io};
  // Memory that exists before the load (the caller's; pinned, which pinning populated) is
  // filled from the page cache by the workers' streaming copy when the copy is guarded.
  const auto& tensors = context_.plan.tensors;
  const bool given = std::any_of(tensors.begin(), tensors.end(),
                                 [](const TensorPlan& tp) { return tp.memory_given(); });
  bool guarded = false;
  if (given) {
    const Status s = io::PrepareMappedCopy();
    guarded = s.ok();
    if (!guarded) context_.load.Note(s.message());
  }
  chunks_.SettleAtStart(facts, guarded);
}

void ReadStage::SizeStaging() {
  // A staged read lands at its file offset's phase within the slot (see TakeStagingSlot); slots
  // are as large as the largest read that may be staged, with whole pages around any phase.
  const uint64_t slot_bytes = chunks_.LargestStaged() + 2 * kHostAlignment;
  uint64_t pool = options_.staging_bytes;
  // A CPU load keeps its staging within a tenth of what it places, so that peak memory stays
  // near the model's size (a GPU load's host memory is its staging, whatever the model).
  const auto& device = context_.destinations.staging_device();
  if (!device) pool = std::min<uint64_t>(pool, context_.plan.placed_bytes / 10);
  staging_.Reset(slot_bytes, std::max<uint64_t>(2, pool / slot_bytes), device);
}

Status ReadStage::EnsureDestinations(uint64_t id) {
  const ReadChunk& chunk = context_.plan.reads[id];
  if (chunk.shared_buffer) {
    if (Status s = context_.tensors.EnsureShared(chunk, context_.destinations); !s.ok()) {
      return chunks_.Error(id, s);
    }
  }
  for (uint32_t t : chunk.tensors) {
    LOADSTONE_RETURN_IF_ERROR(context_.tensors.Ensure(t, context_.destinations));
  }
  return Status::OK();
}

void ReadStage::Pump() {
  auto fail = [&](Status status) {
    window_.Flush();
    context_.load.Fail(std::move(status));
  };
  while (!context_.load.stopping() && window_.has_next()) {
    const uint64_t id = window_.next();
    const ReadChunk& chunk = context_.plan.reads[id];
    if (Status s = EnsureDestinations(id); !s.ok()) return fail(s);
    const std::byte* cached = nullptr;
    const ReadRoute route = chunks_.RouteNow(id, window_.reader(), &cached);
    // Settled once, even when it waits below for a staging slot; a page-cache copy that waits
    // for a worker asks for its view again.
    if (route != ReadRoute::kPageCacheCopy) chunks_[id].route = route;
    io::ReadRequest request{chunk.file, chunk.offset, chunk.length, nullptr, id};
    if (route == ReadRoute::kPageCacheCopy) {
      // Two per worker at most, so that a cancel is not stuck behind a long queue of copies.
      if (cached_copies_ >= 2 * context_.workers_count) break;
      chunks_[id].route = route;  // before the worker's trace reads it
      ++cached_copies_;
      asio::post(context_.workers, [this, hold = context_.load.Hold(), id, cached] {
        CopyCached(id, cached);
      });
    } else if (route == ReadRoute::kStaged) {
      if (!staging_.has_free()) {
        PrepareSlots(/*touch=*/chunk.length * 2 >= staging_.slot_bytes());
        break;
      }
      if (Status st = TakeStagingSlot(id, &request); !st.ok()) return fail(st);
    } else if (route == ReadRoute::kInPlace) {
      request.dst = ReadDestination(id);
    }
    chunks_.Count(id);
    if (route != ReadRoute::kInPlace && route != ReadRoute::kStaged) {
      window_.Skip();
      if (route == ReadRoute::kMapped) {
        // Its bytes are the file's, read on touch: it counts as loaded only if the file is
        // still the one mapped, now (a truncation or rewrite after this is SIGBUS or other
        // bytes on touch, as with any mapping: docs/pipeline.md, "mmap mode").
        if (Status s = CheckMappedFile(chunk.file); !s.ok()) return fail(chunks_.Error(id, s));
        context_.load.AdvanceChunk(id);
      }
      continue;
    }
    if (context_.trace.enabled()) chunks_[id].submitted = context_.trace.Now();
    window_.Issue(request);
  }
  window_.Flush();
}

Status ReadStage::TakeStagingSlot(uint64_t id, io::ReadRequest* request) {
  const ReadChunk& chunk = context_.plan.reads[id];
  std::string note;
  auto taken = staging_.Take(&note);
  if (!taken.ok()) return taken.status().WithContext("staging buffer");
  if (!note.empty()) context_.load.Note(note);
  const size_t s = *taken;
  chunks_[id].slot = static_cast<int>(s);
  // The whole pages around the read, so that O_DIRECT takes all of it in one piece: its
  // unaligned head and tail would otherwise be two more (page-cache) reads each. The read's
  // bytes land at its file phase within the slot; the slot has room.
  const uint64_t a = kHostAlignment;
  const uint64_t end = chunk.offset + chunk.length;
  const uint64_t lo = chunk.offset / a * a;
  const uint64_t file_bytes = context_.checkpoint.files()[chunk.file].bytes;
  const uint64_t hi = std::max(end, std::min((end + a - 1) / a * a, file_bytes));
  *request = {chunk.file, lo, hi - lo, staging_.data(s), id};
  return Status::OK();
}

const std::byte* ReadStage::StagedBytes(uint64_t id) const {
  return staging_.data(static_cast<size_t>(chunks_[id].slot)) +
         context_.plan.reads[id].offset % kHostAlignment;
}

std::byte* ReadStage::ReadDestination(uint64_t id) const {
  const ReadChunk& chunk = context_.plan.reads[id];
  const uint32_t t = chunk.tensors.front();
  const uint64_t first = context_.checkpoint.tensors()[context_.plan.tensors[t].source].offset;
  return context_.tensors.data(t) + (chunk.offset - first);
}

void ReadStage::OnCompletions() {
  for (io::ReadCompletion& c : window_.Reap()) OnReadDone(c.tag, std::move(c.status));
}

void ReadStage::OnReadDone(uint64_t id, Status status) {
  window_.Completed();
  TraceRecorder& trace = context_.trace;
  if (trace.enabled()) {
    trace.SpanInLane(fmt::format("read {}", chunks_.Label(id)), "read", "reads in flight",
                     chunks_[id].submitted, trace.Now(), chunks_.Args(id));
  }
  const bool staged = chunks_[id].route == ReadRoute::kStaged;
  if (!status.ok()) {
    if (staged) ReleaseSlot(id);
    return context_.load.Fail(chunks_.Error(id, status));
  }
  bytes_read_.fetch_add(context_.plan.reads[id].length, std::memory_order_relaxed);
  if (!std::exchange(first_read_back_, true)) context_.load.CancelIfAskedAt(LoadStage::kMidStream);
  if (context_.load.stopping()) {
    if (staged) ReleaseSlot(id);
    return;
  }
  if (staged) return context_.load.Staged(id);
  context_.load.AdvanceChunk(id);
}

void ReadStage::PartDone(uint64_t id) {
  if (--chunks_[id].parts_left == 0) ReleaseSlot(id);
}

void ReadStage::ReleaseSlot(uint64_t id) {
  const int slot = std::exchange(chunks_[id].slot, -1);
  if (slot < 0 || !staging_.Release(static_cast<size_t>(slot))) {  // a bug, never quiet
    context_.load.Fail(Status::Corruption(fmt::format(
        "internal error: staging slot {} of read {} released twice; please report it", slot, id)));
  }
}

void ReadStage::PrepareSlots(bool touch) {
  for (size_t s : staging_.StartPreparing()) {
    asio::post(context_.workers, [this, hold = context_.load.Hold(), s, touch] {
      auto buffer = StagingPool::AllocateHostSlot(staging_.slot_bytes(), touch);
      context_.load.OnLoop([this, s, buffer = std::move(buffer)]() mutable {
        OnSlotPrepared(s, std::move(buffer));
      });
    });
  }
}

void ReadStage::OnSlotPrepared(size_t s, Result<std::shared_ptr<std::byte>> buffer) {
  if (!buffer.ok()) {
    staging_.Dropped();
    context_.load.Fail(buffer.status().WithContext("staging buffer"));
  } else if (context_.load.stopping()) {
    staging_.Dropped();
  } else {
    staging_.Prepared(s, std::move(*buffer));
  }
}

// A page-cache copy (ReadRoute::kPageCacheCopy), on a worker: the cached bytes of one
// unconverted CPU tensor, or of a shared buffer, straight into its fresh pages (UFFDIO_COPY: the
// kernel reads the mapping) or into the caller's memory (io::CopyFromMapping: streaming stores,
// a page that cannot be read caught as an error, not a SIGBUS). Only unconverted reads come
// here: a conversion reads its source more than once and far slower than a copy.
void ReadStage::CopyCached(uint64_t id, const std::byte* source) {
  const auto begin = context_.trace.Now();
  const ReadChunk& chunk = context_.plan.reads[id];
  std::byte* to = ReadDestination(id);
  // In pieces, each let go of as soon as it is copied: the cached pages a copy maps count in
  // this process's RSS, and a whole read per worker would be most of a small-tensor load's peak
  // above its tensors (bench/README.md, the 100k-tensor checkpoint).
  constexpr uint64_t kPiece = 4ULL << 20;
  Status status;
  for (uint64_t at = 0; at < chunk.length && status.ok(); at += kPiece) {
    const uint64_t n = std::min(kPiece, chunk.length - at);
    status = chunks_[id].copy_when_cached
                 ? io::CopyFromMapping(to + at, source + at, n, chunk.offset + at)
                 : context_.destinations.fresh_pages().Write(to + at, source + at, n);
    io::ReleaseCachedView(source + at, n);
  }
  // A file cut inside the read's last page reads as zeros through the mapping, without a
  // fault: the bytes count only if the file still holds all of them after the copy.
  if (status.ok()) status = CheckFileSize(chunk.file, chunk.offset + chunk.length);
  if (!status.ok() && status.code() != StatusCode::kCorruption) {
    status = Status::IOError(fmt::format(
        "copying from the page cache failed ({}): the file could not be read (an I/O error) "
        "or it shrank while loading; check the disk and the file, then load again",
        status.message()));
  }
  if (context_.trace.enabled()) {
    context_.trace.Span(fmt::format("copy {} (page cache)", chunks_.Label(id)), "copy", begin,
                        chunks_.Args(id));
  }
  context_.load.OnLoop([this, id, status = std::move(status)]() mutable {
    OnCachedDone(id, std::move(status));
  });
}

void ReadStage::OnCachedDone(uint64_t id, Status status) {
  --cached_copies_;
  if (!status.ok()) {
    context_.load.Fail(chunks_.Error(id, status));
  } else if (!context_.load.stopping()) {
    bytes_read_.fetch_add(context_.plan.reads[id].length, std::memory_order_relaxed);
    context_.load.AdvanceChunk(id);
  }
}

Status ReadStage::CheckFileSize(uint32_t file, uint64_t needed) const {
  const Checkpoint& checkpoint = context_.checkpoint;
  const CheckpointFile& f = checkpoint.files()[file];
  uint64_t now = 0;
  if (window_.open()) {  // the file read, even if another has been renamed over its path since
    LOADSTONE_ASSIGN_OR_RETURN(now, window_.reader().SizeNow(file));
  } else if (io::IsRemoteAddress(f.path)) {
    return Status::OK();  // checked (size and version) when the reader opens, and on each range
  } else {
    struct stat st;
    if (::stat(f.path.c_str(), &st) != 0) return io::ErrnoStatus(errno, "cannot stat", f.path);
    now = static_cast<uint64_t>(st.st_size);
  }
  if (now == f.bytes || (needed != 0 && now >= needed)) return Status::OK();
  // The first tensor the file no longer holds, for the message.
  const TensorInfo* lost = nullptr;
  for (const TensorInfo& t : checkpoint.tensors()) {
    const bool cut = t.file == file && t.offset + t.nbytes > now;
    if (cut && (!lost || t.offset < lost->offset)) lost = &t;
  }
  return Status::Corruption(fmt::format(
      "'{}' is {} bytes, {} when the checkpoint was opened: it changed{}; open the checkpoint "
      "again (and do not rewrite a file while it loads)",
      f.path, now, f.bytes,
      lost ? fmt::format(", and tensor '{}' (bytes {}..{}) is past its end", lost->name,
                         lost->offset, lost->offset + lost->nbytes)
           : std::string()));
}

Status ReadStage::CheckMappedFile(uint32_t file) const {
  Status changed = context_.destinations.CheckMapped(file);
  if (changed.ok()) return changed;
  Status size = CheckFileSize(file, 0);
  return size.ok() ? changed : size;
}

bool ReadStage::idle() const {
  return window_.in_flight() == 0 && cached_copies_ == 0 && staging_.preparing() == 0;
}

std::optional<ReadStats> ReadStage::Close(uint64_t conversions_moved, std::string cache) {
  std::optional<ReadStats> out;
  if (window_.open()) {  // nothing in flight: closes the ring and the files now
    const io::ReaderStats s = window_.Close();
    out = ReadStats{.direct_bytes = s.direct_bytes,
                    .buffered_bytes = s.buffered_bytes,
                    .bounced_bytes = s.bounced_bytes,
                    .resubmits = s.resubmits,
                    .network_bytes = s.network_bytes,
                    .routes = chunks_.counts(),
                    .conversions_moved = conversions_moved,
                    .cache = cache.empty() ? cache_note_ : std::move(cache)};
  }
  return out;
}

}  // namespace loadstone::pipeline
