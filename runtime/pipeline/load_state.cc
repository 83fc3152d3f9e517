#include "runtime/pipeline/load_state.h"

#include <unistd.h>

#include <asio/post.hpp>
#include <asio/read.hpp>
#include <algorithm>
#include <cerrno>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/posix_error.h"

namespace loadstone {
namespace {

__extension__ using Wide = unsigned __int128;  // products of two byte counts

io::ReaderBackend ToIo(ReadBackend backend) {
  switch (backend) {
    case ReadBackend::kUring: return io::ReaderBackend::kUring;
    case ReadBackend::kPread: return io::ReaderBackend::kPread;
    case ReadBackend::kAuto: break;
  }
  return io::ReaderBackend::kAuto;
}

// "cpu", then "cuda:0" to "cuda:{count - 1}": LoadNames::devices.
std::vector<std::string> DeviceNames(size_t count) {
  std::vector<std::string> out = {"cpu"};
  for (size_t i = 0; i < count; ++i) out.push_back(fmt::format("cuda:{}", i));
  return out;
}

}  // namespace

LoadHandle::State::State(asio::io_context& loop_in, asio::thread_pool& workers_in,
                         asio::thread_pool& callback_pool, Checkpoint checkpoint_in,
                         LoadPlan plan_in, LoadOptions options_in,
                         const LoaderOptions& loader_options_in,
                         ReaderFactory reader_factory, device::DeviceSet devices_in,
                         std::string device_log_in)
    : loop(loop_in),
      workers(workers_in),
      checkpoint(std::move(checkpoint_in)),
      plan(std::move(plan_in)),
      options(std::move(options_in)),
      loader_options(loader_options_in),
      devices(std::move(devices_in)),
      device_log(std::move(device_log_in)),
      tensor_names(std::make_shared<const LoadNames>(LoadNames{checkpoint, DeviceNames(devices.size())})),
      tensors(plan.tensors.size()),
      done(done_promise.get_future().share()),
      trace(options.trace),
      callbacks(callback_pool, plan.tensors.size()),
      reader_factory_(std::move(reader_factory)),
      workers_count_(loader_options.worker_threads > 0
                         ? static_cast<size_t>(loader_options.worker_threads)
                         : std::max(1u, std::thread::hardware_concurrency())),
      budget_(std::make_shared<pipeline::HostMemoryBudget>(options.host_memory_limit)),
      small_tensors_(budget_),
      plan_error_(CheckPlan(checkpoint, plan)) {
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    tensors[i].future = tensors[i].promise.get_future().share();
    if (!plan_error_.ok()) continue;  // Start() fails the load; the plan's indices are not used
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[i].source];
    by_name.emplace(src.name, i);
    tensors[i].remaining = src.nbytes;
  }
  if (options.on_tensor) callbacks.Add(options.on_tensor);
  if (options.on_progress) {  // after each tensor, with the progress then (this State outlives it)
    callbacks.Add([this](const loadstone::Tensor&) { options.on_progress(Snapshot()); });
  }
}

Progress LoadHandle::State::Snapshot() const {
  Progress p;
  p.bytes_total = plan.read_bytes;
  p.bytes_read = bytes_read.load();
  p.bytes_to_place = plan.placed_bytes;
  p.bytes_placed = bytes_placed.load();
  p.tensors_total = tensors.size();
  p.tensors_done = tensors_done.load();
  const double seconds = final_seconds.load();
  p.seconds = seconds >= 0 ? seconds
                           : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  p.read_gbps = p.seconds > 0 ? p.bytes_read / p.seconds / 1e9 : 0;
  if (p.bytes_read > 0 && p.bytes_read < p.bytes_total) {
    p.eta_seconds = p.seconds * (p.bytes_total - p.bytes_read) / p.bytes_read;
  }
  return p;
}

// A plan is used only with the checkpoint it was made for, and only when every index in it
// points where it should (a plan is a value a program may keep, copy or build).
Status LoadHandle::State::CheckPlan(const Checkpoint& checkpoint, const LoadPlan& plan) {
  if (plan.checkpoint_fingerprint != checkpoint.fingerprint()) {
    return Status::InvalidArgument(fmt::format(
        "this plan was made for another checkpoint (fingerprint {:016x}, the checkpoint's "
        "{:016x}: other files, sizes or tensors, or a plan not made by Plan()); plan it again "
        "with Plan() for this checkpoint ({})",
        plan.checkpoint_fingerprint, checkpoint.fingerprint(),
        checkpoint.files().empty() ? std::string("no files") : checkpoint.files()[0].path));
  }
  const size_t n = checkpoint.tensors().size();
  for (const TensorPlan& t : plan.tensors) {
    if (t.source >= n || t.scale >= plan.tensors.size()) {
      return Status::InvalidArgument("the plan names a tensor the checkpoint does not have; plan it again");
    }
  }
  for (const ReadChunk& r : plan.reads) {
    if (r.file >= checkpoint.files().size() || r.tensors.empty()) {
      return Status::InvalidArgument("the plan reads a file the checkpoint does not have; plan it again");
    }
    for (uint32_t t : r.tensors) {
      if (t >= plan.tensors.size()) {
        return Status::InvalidArgument("the plan reads into a tensor it does not have; plan it again");
      }
    }
  }
  return Status::OK();
}

std::string LoadHandle::State::TraceLabel(uint64_t id) const {
  const ReadChunk& chunk = plan.reads[id];
  const std::string& first = checkpoint.tensors()[plan.tensors[chunk.tensors.front()].source].name;
  return chunk.tensors.size() == 1 ? first
                                   : fmt::format("{} and {} more", first, chunk.tensors.size() - 1);
}

std::string_view LoadHandle::State::Route(uint64_t id) const {
  if (staged_[id] <= 0) return "in place";
  return plan.reads[id].staged ? "staged" : "staged (cold)";
}

std::string LoadHandle::State::TraceArgs(uint64_t id, std::string_view route) const {
  const ReadChunk& chunk = plan.reads[id];
  nlohmann::json args = {{"file", checkpoint.files()[chunk.file].path},
                         {"offset", chunk.offset},
                         {"bytes", chunk.length},
                         {"route", route}};
  auto& names = args["tensors"] = nlohmann::json::array();
  for (size_t k = 0; k < chunk.tensors.size() && k < 8; ++k) {
    names.push_back(checkpoint.tensors()[plan.tensors[chunk.tensors[k]].source].name);
  }
  if (chunk.tensors.size() > 8) args["more_tensors"] = chunk.tensors.size() - 8;
  return args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void LoadHandle::State::Start() {
  Begin();
  started_promise.set_value();  // backend() has its final text (or the load failed)
}

void LoadHandle::State::Begin() {
  trace.NameThread("event loop");
  if (!plan_error_.ok()) return Fail(plan_error_);
  // Files that changed since Open are found before any byte is read or mapped from them.
  for (uint32_t f = 0; f < checkpoint.files().size(); ++f) {
    if (Status s = CheckFileSize(f, 0); !s.ok()) return Fail(s);
  }
  // A callback that throws fails the load (the Loader is alive: it waits for Done()).
  callbacks.OnFailure([weak = weak_from_this()](Status status) {
    if (auto self = weak.lock()) {
      asio::post(self->loop, [self, status = std::move(status)] {
        if (!self->finished) self->Fail(status);
      });
    }
  });
  std::vector<std::string> paths;
  for (const CheckpointFile& f : checkpoint.files()) paths.push_back(f.path);
  io::ReaderOptions ro;
  ro.backend = ToIo(loader_options.backend);
  ro.queue_depth = loader_options.queue_depth;
  ro.direct = loader_options.direct_io;
  // ro.max_chunk stays the reader's default: it splits the plan's reads into the pieces the
  // kernel handles best (io/reader.h).
  // Every read this executor issues lands in phase with its file offset (staging slots and
  // whole pages; in-place buffers allocated at the offset's phase, EnsureDestination) unless
  // tensors must be 64-byte aligned: only then do O_DIRECT reads need bounce buffers. Without
  // them the reader keeps no pool (measured: 0 bounced bytes cold and warm, and 32 MiB of pinned
  // memory less); a read that is not in phase after all goes through the page cache, and
  // ReadStats says so (buffered_bytes).
  if (!loader_options.align_tensors) ro.bounce_bytes = 0;
  std::string log;
  auto reader = reader_factory_ ? reader_factory_(paths, ro, &log) : io::OpenReader(paths, ro, &log);
  if (!reader.ok()) return Fail(reader.status());
  reader_ = std::move(*reader);
  {
    std::lock_guard lock(callbacks_mu);
    backend_description = reader_->Describe();
  }
  const int fd = ::dup(reader_->completion_fd());
  if (fd < 0) return Fail(io::ErrnoStatus(errno, "cannot watch the reader's completions of", paths[0]));
  completion_fd_ = std::make_unique<asio::posix::stream_descriptor>(loop, fd);

  if (options.mmap) {
    if (Status s = MapFiles(); !s.ok()) return Fail(s);
  }
  chunk_parts_left_.assign(plan.reads.size(), 0);
  tensor_device_.assign(tensors.size(), -1);
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = plan.tensors[i].device;
    if (name == "cpu") continue;
    int ordinal = -1;
    if (name.rfind("cuda:", 0) == 0) ordinal = std::atoi(name.c_str() + 5);
    if (ordinal < 0 || ordinal >= static_cast<int>(devices.size())) {
      return Fail(Status::InvalidArgument(fmt::format(
          "tensor '{}' is planned on {}, but {}; plan for the devices this machine has "
          "(--device-map cpu, or auto without --max-memory for GPUs)",
          checkpoint.tensors()[plan.tensors[i].source].name, name,
          devices.empty() ? fmt::format("the Loader has no GPU ({})", device_log)
                          : fmt::format("this machine has {} GPU(s), cuda:0 to cuda:{}",
                                        devices.size(), devices.size() - 1))));
    }
    tensor_device_[i] = ordinal;
    if (!staging_device_) staging_device_ = devices[ordinal];
  }
  slot_of_chunk_.assign(plan.reads.size(), -1);
  staged_only_.assign(tensors.size(), true);
  for (const ReadChunk& chunk : plan.reads) {
    if (!chunk.staged) {
      for (uint32_t t : chunk.tensors) staged_only_[t] = false;
    }
  }
  OpenFreshPages();
  SizeStaging();
  if (trace.enabled()) submitted_at_.resize(plan.reads.size());

  for (uint32_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].remaining == 0 && !tensors[i].done) {
      if (Status s = EnsureDestination(i); !s.ok()) return Fail(s);
      Advance(i, 0);
    }
  }
  ArmCompletions();
  Pump();
  MaybeFinish();
}

void LoadHandle::State::SizeStaging() {
  const bool stage_cold =
      loader_options.stage_cold_reads && loader_options.direct_io && !options.mmap;
  staged_.resize(plan.reads.size());
  // A staged read lands at its file offset's phase within the slot (see EnsureDestination).
  uint64_t largest = 0;
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    const bool fresh = std::any_of(plan.reads[i].tensors.begin(), plan.reads[i].tensors.end(),
                                   [&](uint32_t t) { return fresh_tensor_[t]; });
    staged_[i] = plan.reads[i].staged || fresh ? 1 : stage_cold ? -1 : 0;
    if (staged_[i] != 0) largest = std::max(largest, plan.reads[i].length);
  }
  slot_bytes_ = largest + 2 * pipeline::kHostAlignment;  // whole pages around any phase
  uint64_t pool = loader_options.staging_bytes;
  // A CPU load keeps its staging within a tenth of what it places, so that peak memory stays
  // near the model's size (a GPU load's host memory is its staging, whatever the model).
  if (!staging_device_) pool = std::min<uint64_t>(pool, plan.placed_bytes / 10);
  const size_t slots = std::max<uint64_t>(2, pool / slot_bytes_);
  staging_.resize(slots);
  // Device staging (pinned) is allocated on first use; host staging is prepared by the workers.
  auto& initial = staging_device_ ? free_slots_ : unprepared_slots_;
  for (size_t i = slots; i > 0; --i) initial.push_back(i - 1);
}

void LoadHandle::State::Pump() {
  std::vector<io::ReadRequest> batch;
  while (!stopping_ && next_read_ < plan.reads.size() &&
         reads_in_flight_ < static_cast<size_t>(loader_options.queue_depth) * 2) {
    const ReadChunk& chunk = plan.reads[next_read_];
    const uint64_t id = next_read_;
    for (uint32_t t : chunk.tensors) {
      if (Status s = EnsureDestination(t); !s.ok()) {
        if (!batch.empty()) reader_->Submit(batch);
        return Fail(s);
      }
    }
    if (const std::byte* source = CachedSource(id)) {
      // Two per worker at most, so that a cancel is not stuck behind a long queue of copies.
      if (cached_copies_ >= 2 * workers_count_) break;
      ++next_read_;
      ++cached_copies_;
      ++conversions_in_flight_;
      asio::post(workers,
                 [self = shared_from_this(), id, source] { self->CopyCached(id, source); });
      continue;
    }
    const TensorPlan& first = plan.tensors[chunk.tensors.front()];
    const TensorInfo& first_src = checkpoint.tensors()[first.source];
    io::ReadRequest request{chunk.file, chunk.offset, chunk.length, nullptr, id};
    // A cold read for the CPU goes through staging too (LoaderOptions::stage_cold_reads).
    if (staged_[id] < 0) staged_[id] = reader_->ReadsDirect(chunk.file, chunk.offset, chunk.length);
    if (staged_[id] > 0) {
      if (free_slots_.empty()) {
        PrepareSlots(/*touch=*/chunk.length * 2 >= slot_bytes_);
        break;
      }
      const size_t s = free_slots_.back();
      if (!staging_[s].buffer) {
        if (Status st = AllocateStagingSlot(s); !st.ok()) {
          if (!batch.empty()) reader_->Submit(batch);
          return Fail(st.WithContext("staging buffer"));
        }
      }
      free_slots_.pop_back();
      slot_of_chunk_[id] = static_cast<int>(s);
      // The whole pages around the chunk, so that O_DIRECT takes all of it in one piece: its
      // unaligned head and tail would otherwise be two more (page-cache) reads each. The
      // chunk's bytes land at its file phase within the slot, as before; the slot has room.
      const uint64_t a = pipeline::kHostAlignment;
      const uint64_t end = chunk.offset + chunk.length;
      const uint64_t lo = chunk.offset / a * a;
      const uint64_t hi =
          std::max(end, std::min((end + a - 1) / a * a, checkpoint.files()[chunk.file].bytes));
      request = {chunk.file, lo, hi - lo, staging_[s].buffer.get(), id};
    } else if (options.mmap && first.conversion == Conversion::kNone) {
      mapped_bytes.fetch_add(chunk.length, std::memory_order_relaxed);
      Advance(chunk.tensors.front(), chunk.length);
      ++next_read_;
      continue;
    } else {
      request.dst = tensors[chunk.tensors.front()].data + (chunk.offset - first_src.offset);
    }
    if (trace.enabled()) submitted_at_[id] = trace.Now();
    batch.push_back(request);
    ++reads_in_flight_;
    ++next_read_;
  }
  if (!batch.empty()) reader_->Submit(batch);
}

void LoadHandle::State::ArmCompletions() {
  // A real read of the eventfd (not a readiness wait), so that a completion signalled between
  // the last Reap and this call is never missed.
  completion_fd_->async_read_some(
      asio::buffer(&eventfd_buffer_, sizeof(eventfd_buffer_)),
      [self = shared_from_this()](const asio::error_code& ec, size_t) {
        if (ec == asio::error::operation_aborted || self->finished) return;
        self->OnCompletions();
      });
}

void LoadHandle::State::OnCompletions() {
  reaped_.clear();
  reader_->Reap(&reaped_);
  for (io::ReadCompletion& c : reaped_) OnReadDone(c.tag, std::move(c.status));
  Pump();
  MaybeFinish();
  if (!finished) ArmCompletions();
}

Status LoadHandle::State::ChunkError(uint64_t id, const Status& status) const {
  const ReadChunk& chunk = plan.reads[id];
  std::string names;
  for (size_t k = 0; k < chunk.tensors.size() && k < 3; ++k) {
    names += (k ? ", '" : "'") + checkpoint.tensors()[plan.tensors[chunk.tensors[k]].source].name + "'";
  }
  if (chunk.tensors.size() > 3) names += fmt::format(" and {} more", chunk.tensors.size() - 3);
  return status.WithContext(fmt::format("loading tensor {} (bytes {}..{} of '{}')", names,
                                        chunk.offset, chunk.offset + chunk.length,
                                        checkpoint.files()[chunk.file].path));
}

void LoadHandle::State::OnReadDone(uint64_t id, Status status) {
  --reads_in_flight_;
  const ReadChunk& chunk = plan.reads[id];
  if (trace.enabled()) {
    trace.SpanInLane(fmt::format("read {}", TraceLabel(id)), "read", "reads in flight",
                     submitted_at_[id], trace.Now(), TraceArgs(id, Route(id)));
  }
  if (!status.ok()) {
    if (staged_[id] > 0) free_slots_.push_back(static_cast<size_t>(slot_of_chunk_[id]));
    return Fail(ChunkError(id, status));
  }
  bytes_read.fetch_add(chunk.length, std::memory_order_relaxed);
  if (stopping_) {
    if (staged_[id] > 0) free_slots_.push_back(static_cast<size_t>(slot_of_chunk_[id]));
    return;
  }
  if (staged_[id] <= 0) return Advance(chunk.tensors.front(), chunk.length);
  for (uint32_t t : chunk.tensors) {
    const TensorPlan& tp = plan.tensors[t];
    if (tp.conversion == Conversion::kDequantFp8Block && !tensors[tp.scale].done) {
      // The scales' read was issued before this one (plan.cc): it is in flight or being placed.
      waiting_for_scales_[tp.scale].push_back(id);
      return;
    }
  }
  DispatchStaged(id);
}

void LoadHandle::State::Advance(uint32_t index, uint64_t source_bytes) {
  TensorSlot& slot = tensors[index];
  const TensorPlan& tp = plan.tensors[index];
  const TensorInfo& src = checkpoint.tensors()[tp.source];
  // Placed bytes in proportion to the source bytes in place, so that a tensor's pieces add up
  // to exactly its placed size (a cast changes the size; rounding piece by piece would not).
  auto placed = [&](uint64_t remaining) -> uint64_t {
    if (src.nbytes == 0) return 0;
    return static_cast<uint64_t>(static_cast<Wide>(src.nbytes - remaining) * tp.nbytes /
                                 src.nbytes);
  };
  const uint64_t before = placed(slot.remaining);
  slot.remaining -= source_bytes;
  bytes_placed.fetch_add(placed(slot.remaining) - before, std::memory_order_relaxed);
  if (slot.remaining != 0 || slot.done) return;
  slot.done = true;
  std::shared_ptr<const loadstone::Tensor::HostCopier> copier;
  if (tensor_device_[index] >= 0) {
    copier = std::make_shared<const loadstone::Tensor::HostCopier>(
        [device = devices[tensor_device_[index]], data = slot.data,
         bytes = tp.nbytes](std::span<std::byte> dst) {
          return device->CopyToHost(data, bytes, dst.data());
        });
  }
  loadstone::Tensor tensor = TensorAccess::Make(
      tensor_names, src, static_cast<size_t>(tensor_device_[index] + 1), tp.dtype, slot.buffer,
      slot.data, tp.nbytes, std::move(copier));
  slot.promise.set_value(tensor);
  tensors_done.fetch_add(1, std::memory_order_relaxed);
  if (auto waiting = waiting_for_scales_.extract(index)) {
    for (uint64_t id : waiting.mapped()) DispatchStaged(id);
  }
  trace.Instant(fmt::format("ready {}", src.name), "tensor");
  callbacks.Deliver(index, slot.future);
}

void LoadHandle::State::Fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
  stopping_ = true;
  if (reader_) reader_->Cancel();
  MaybeFinish();
}

void LoadHandle::State::RequestCancel() {
  asio::post(loop, [self = shared_from_this()] {
    if (!self->finished) self->Fail(Status::Cancelled("the load was cancelled"));
  });
}

void LoadHandle::State::MaybeFinish() {
  if (finished || reads_in_flight_ != 0 || conversions_in_flight_ != 0 || slots_preparing_ != 0) {
    return;
  }
  if (!stopping_ && tensors_done.load() != tensors.size()) return;
  final_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  finished = true;
  completion_fd_.reset();  // aborts the pending wait
  if (reader_) {
    const io::ReaderStats stats = reader_->stats();
    std::lock_guard lock(callbacks_mu);
    read_stats = {stats.direct_bytes, stats.buffered_bytes, stats.bounced_bytes, stats.resubmits,
                  cache_copied_bytes.load(), mapped_bytes.load()};
  }
  reader_.reset();         // nothing in flight: closes the ring and the files now
  fresh_.reset();          // every placed tensor is whole: unregisters their pages
  Status result = error_;
  if (result.ok() && tensors_done.load() != tensors.size()) {
    result = Status::Corruption("the load ended with tensors not in place");  // a bug, never OK
  }
  if (!result.ok()) {
    for (TensorSlot& slot : tensors) {
      if (slot.done) continue;
      slot.promise.set_exception(std::make_exception_ptr(Error(result)));
      slot.buffer.reset();
      slot.data = nullptr;
    }
  }
  staging_.clear();
  trace.Instant(result.ok() ? "done" : "failed", "load");
  // Done() resolves after the load's last callback has returned (or failed the load).
  callbacks.Close(result, [self = shared_from_this()](Status status) {
    self->done_promise.set_value(std::move(status));
  });
}

}  // namespace loadstone
