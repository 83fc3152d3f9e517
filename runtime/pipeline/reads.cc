// The read window, on the loop thread: reads issued in plan order while there is room (reads in
// flight, staging slots, the workers' cached copies), their completions reaped and routed.
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <algorithm>

#include <fmt/format.h>

#include "runtime/pipeline/load_state.h"

namespace loadstone {

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
      if (Status st = TakeStagingSlot(id, &request); !st.ok()) {
        if (!batch.empty()) reader_->Submit(batch);
        return Fail(st);
      }
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

Status LoadHandle::State::TakeStagingSlot(uint64_t id, io::ReadRequest* request) {
  const ReadChunk& chunk = plan.reads[id];
  const size_t s = free_slots_.back();
  if (!staging_[s].buffer) {
    if (Status st = AllocateStagingSlot(s); !st.ok()) {
      return st.WithContext("staging buffer");
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
  *request = {chunk.file, lo, hi - lo, staging_[s].buffer.get(), id};
  return Status::OK();
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

}  // namespace loadstone
