// Pump and its completions, on the loop thread: the plan's reads issued through the read window
// (read_window.h) while there is room (reads in flight, staging slots, the workers' cached
// copies), each on the route it takes (routes.h), their completions reaped and handed on.
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <algorithm>

#include <utility>

#include <fmt/format.h>

#include "runtime/pipeline/load_state.h"
#include "runtime/pipeline/routes.h"

namespace loadstone {

void LoadHandle::State::Pump() {
  auto fail = [&](Status status) {
    window_.Flush();
    Fail(std::move(status));
  };
  while (!stopping_ && window_.has_next()) {
    const uint64_t id = window_.next();
    const ReadChunk& chunk = plan.reads[id];
    if (chunk.shared_buffer) {
      if (Status s = EnsureSharedBuffer(id); !s.ok()) return fail(s);
    }
    for (uint32_t t : chunk.tensors) {
      if (Status s = EnsureDestination(t); !s.ok()) return fail(s);
    }
    const std::byte* cached = nullptr;
    const ReadRoute route = chunks_.RouteNow(id, window_.reader(), &cached);
    // Settled once, even when it waits below for a staging slot; a page-cache copy that waits
    // for a worker asks for its view again.
    if (route != ReadRoute::kPageCacheCopy) chunks_[id].route = route;
    io::ReadRequest request{chunk.file, chunk.offset, chunk.length, nullptr, id};
    if (route == ReadRoute::kPageCacheCopy) {
      // Two per worker at most, so that a cancel is not stuck behind a long queue of copies.
      if (in_flight_.cached_copies >= 2 * workers_count_) break;
      chunks_[id].route = route;  // before the worker's trace reads it
      ++in_flight_.cached_copies;
      asio::post(workers,
                 [self = shared_from_this(), id, cached] { self->CopyCached(id, cached); });
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
        if (Status s = CheckMappedFile(chunk.file); !s.ok()) {
          return fail(chunks_.Error(id, s));
        }
        AdvanceChunk(id);
      }
      continue;
    }
    if (trace.enabled()) chunks_[id].submitted = trace.Now();
    window_.Issue(request);
  }
  window_.Flush();
}

Status LoadHandle::State::TakeStagingSlot(uint64_t id, io::ReadRequest* request) {
  const ReadChunk& chunk = plan.reads[id];
  std::string note;
  auto taken = staging_.Take(&note);
  if (!taken.ok()) return taken.status().WithContext("staging buffer");
  if (!note.empty()) {
    std::lock_guard lock(callbacks_mu);
    backend_description += "; " + note;
  }
  const size_t s = *taken;
  chunks_[id].slot = static_cast<int>(s);
  // The whole pages around the chunk, so that O_DIRECT takes all of it in one piece: its
  // unaligned head and tail would otherwise be two more (page-cache) reads each. The
  // chunk's bytes land at its file phase within the slot, as before; the slot has room.
  const uint64_t a = pipeline::kHostAlignment;
  const uint64_t end = chunk.offset + chunk.length;
  const uint64_t lo = chunk.offset / a * a;
  const uint64_t hi =
      std::max(end, std::min((end + a - 1) / a * a, checkpoint.files()[chunk.file].bytes));
  *request = {chunk.file, lo, hi - lo, staging_.data(s), id};
  return Status::OK();
}

void LoadHandle::State::ArmCompletions() {
  window_.Arm([self = shared_from_this()](const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted || self->finished) return;
    self->OnCompletions();
    self->Schedule();
    if (!self->finished) self->ArmCompletions();
  });
}

void LoadHandle::State::OnCompletions() {
  for (io::ReadCompletion& c : window_.Reap()) OnReadDone(c.tag, std::move(c.status));
}

void LoadHandle::State::OnReadDone(uint64_t id, Status status) {
  window_.Completed();
  const ReadChunk& chunk = plan.reads[id];
  if (trace.enabled()) {
    trace.SpanInLane(fmt::format("read {}", chunks_.Label(id)), "read", "reads in flight",
                     chunks_[id].submitted, trace.Now(), chunks_.Args(id));
  }
  const bool staged = chunks_[id].route == ReadRoute::kStaged;
  if (!status.ok()) {
    if (staged) ReleaseSlot(id);
    return Fail(chunks_.Error(id, status));
  }
  bytes_read.fetch_add(chunk.length, std::memory_order_relaxed);
  if (!std::exchange(first_read_back_, true)) CancelIfAskedAt(LoadStage::kMidStream);
  if (stopping_) {
    if (staged) ReleaseSlot(id);
    return;
  }
  if (!staged) return AdvanceChunk(id);
  for (uint32_t t : chunk.tensors) {
    const TensorPlan& tp = plan.tensors[t];
    if (UsesScales(tp.conversion) && !tensors.done(tp.scale)) {
      // The scales' read was issued before this one (plan.cc): it is in flight or being placed.
      waiting_for_scales_[tp.scale].push_back(id);
      return;
    }
  }
  DispatchStaged(id);
}

}  // namespace loadstone
