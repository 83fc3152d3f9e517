// Staged chunks and page-cache copies: the staging slots prepared, the chunks' pieces handed to
// the workers (Placer::PlaceOnCpu) and the devices (Placer::DeviceJob), float8 weights held back
// until their scales are in place. Members of LoadHandle::State (load_state.h); the loop-thread
// rule of that file holds here.
#include "runtime/pipeline/load_state.h"

#include <asio/post.hpp>
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/mapped_copy.h"
#include "io/reader.h"

namespace loadstone {
using pipeline::PieceOf;

void LoadHandle::State::DispatchStaged(uint64_t id) {
  const ReadChunk& chunk = plan.reads[id];
  const size_t slot = static_cast<size_t>(chunks_[id].slot);
  const std::byte* staged = StagedBytes(id, slot);
  bool cpu_pieces = false;
  for (uint32_t t : chunk.tensors) {
    const int device = DeviceOf(t);
    if (device < 0) {
      cpu_pieces = true;
      continue;
    }
    ++chunks_[id].parts_left;
    ++in_flight_.device_pieces;
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
    if (sites_[t] == ConversionSite::kCpuThenDevice) {
      asio::post(workers, [self = shared_from_this(), id, slot, t] {
        self->PrepareForDevice(id, slot, t);
      });
      continue;
    }
    if (Unpacks(plan.tensors[t].conversion)) {
      auto quant = DeviceQuant(t);
      auto job = quant.ok() ? placer_.QuantJob(chunk, t, tensors.data(t), staged, *quant)
                            : Result<device::PlaceJob>(quant.status());
      const auto [lo, hi] = PieceOf(chunk, src);
      if (!job.ok()) {  // after this loop: the chunk's other tensors still read its slot
        OnLoop([id, t, bytes = hi - lo, status = job.status()](State& self) mutable {
          self.OnDevicePieceDone(id, t, bytes, std::move(status));
        });
        continue;
      }
      SubmitDevicePiece(id, t, std::move(*job), hi - lo, nullptr);
      continue;
    }
    const auto [lo, hi] = PieceOf(chunk, src);
    SubmitDevicePiece(id, t,
                      placer_.DeviceJob(chunk, t, tensors.data(t), ScalesOf(t), staged), hi - lo,
                      nullptr);
  }
  if (cpu_pieces) {
    ++chunks_[id].parts_left;
    ++in_flight_.cpu_pieces;
    asio::post(workers, [self = shared_from_this(), id, slot] { self->ConvertStaged(id, slot); });
  }
}

Result<std::shared_ptr<const device::QuantDecode>> LoadHandle::State::DeviceQuant(uint32_t t) {
  auto start_upload = [this, t] {
    ++in_flight_.quant_uploads;
    return [self = shared_from_this(), t](Status status) {
      self->OnLoop([t, status = std::move(status)](State& state) {
        --state.in_flight_.quant_uploads;
        if (status.ok()) return;
        state.Fail(status.WithContext(
            fmt::format("copying the quant state of tensor '{}' to {}",
                        state.checkpoint.tensors()[state.plan.tensors[t].source].name,
                        state.plan.device_of(t).ToString())));
      });
    };
  };
  return device_quant_.For(t, ScalesOf(t), *devices[DeviceOf(t)], start_upload);
}

void LoadHandle::State::PrepareForDevice(uint64_t id, size_t slot, uint32_t t) {
  const ReadChunk& chunk = plan.reads[id];
  const auto [lo, hi] = PieceOf(chunk, checkpoint.tensors()[plan.tensors[t].source]);
  const bool decode = Unpacks(plan.tensors[t].conversion);
  auto plain = std::make_shared<std::vector<std::byte>>();
  const std::byte* from = StagedBytes(id, slot) + (lo - chunk.offset);
  Status status = decode ? placer_.Dequantize(t, ScalesOf(t), from, lo, hi, plain.get())
                         : placer_.Relayout(t, from, lo, hi, plain.get());
  OnLoop([id, t, lo = lo, hi = hi, decode, plain = std::move(plain),
          status = std::move(status)](State& self) mutable {
    if (!status.ok() || self.stopping_) {
      self.OnDevicePieceDone(id, t, hi - lo, std::move(status));
      return;
    }
    device::PlaceJob job =
        decode ? self.placer_.DequantizedJob(t, self.tensors.data(t), *plain, lo)
               : self.placer_.DeviceJobFrom(t, self.tensors.data(t), self.ScalesOf(t),
                                            plain->data(), lo, lo + plain->size());
    self.SubmitDevicePiece(id, t, std::move(job), hi - lo, std::move(plain));
  });
}

void LoadHandle::State::SubmitDevicePiece(uint64_t id, uint32_t t,
                                          device::PlaceJob job, uint64_t file_bytes,
                                          std::shared_ptr<std::vector<std::byte>> keep) {
  if (trace.enabled()) {  // the device's own copy and kernel times, one track per stream
    job.timed = [self = shared_from_this(), t, bytes = job.bytes](const device::JobTiming& at) {
      const TensorPlan& p = self->plan.tensors[t];
      const std::string track = self->plan.device_of(t).ToString();
      const std::string args = fmt::format(
          R"({{"tensor":{}}})", nlohmann::json(self->checkpoint.tensors()[p.source].name).dump());
      self->trace.SpanOnTrack(fmt::format("h2d {} B", bytes), "device", track + " copy",
                              at.copy_begin, at.copy_end, args);
      if (at.kernel_end > at.kernel_begin) {
        self->trace.SpanOnTrack(fmt::format("{} {}", ConversionName(p.conversion),
                                            TorchName(p.dtype)),
                                "device", track + " compute", at.kernel_begin, at.kernel_end,
                                args);
      }
    };
  }
  job.done = [self = shared_from_this(), id, t, bytes = file_bytes,
              keep = std::move(keep)](Status s) {
    self->OnLoop([id, t, bytes, keep, s = std::move(s)](State& state) mutable {
      state.OnDevicePieceDone(id, t, bytes, std::move(s));
    });
  };
  CancelIfAskedAt(LoadStage::kDeviceCopy);
  devices[DeviceOf(t)]->Submit(std::move(job));
}

void LoadHandle::State::OnDevicePieceDone(uint64_t id, uint32_t tensor, uint64_t bytes,
                                          Status status) {
  --in_flight_.device_pieces;
  if (!status.ok()) {
    Fail(status.WithContext(fmt::format("placing tensor '{}' on {}",
                                        checkpoint.tensors()[plan.tensors[tensor].source].name,
                                        plan.device_of(tensor).ToString())));
  } else if (!stopping_) {
    Advance(tensor, bytes);
  }
  ChunkPartDone(id);
}

void LoadHandle::State::ChunkPartDone(uint64_t id) {
  if (--chunks_[id].parts_left == 0) ReleaseSlot(id);
}

void LoadHandle::State::ReleaseSlot(uint64_t id) {
  const int slot = std::exchange(chunks_[id].slot, -1);
  if (slot < 0 || !staging_.Release(static_cast<size_t>(slot))) {  // a bug, never quiet
    Fail(Status::Corruption(fmt::format(
        "internal error: staging slot {} of read {} released twice; please report it", slot, id)));
  }
}

void LoadHandle::State::PrepareSlots(bool touch) {
  for (size_t s : staging_.StartPreparing()) {
    asio::post(workers, [self = shared_from_this(), s, touch] {
      auto buffer = pipeline::StagingPool::AllocateHostSlot(self->staging_.slot_bytes(), touch);
      self->OnLoop([s, buffer = std::move(buffer)](State& state) mutable {
        state.OnSlotPrepared(s, std::move(buffer));
      });
    });
  }
}

void LoadHandle::State::OnSlotPrepared(size_t s, Result<std::shared_ptr<std::byte>> buffer) {
  if (!buffer.ok()) {
    staging_.Dropped();
    Fail(buffer.status().WithContext("staging buffer"));
  } else if (stopping_) {
    staging_.Dropped();
  } else {
    staging_.Prepared(s, std::move(*buffer));
  }
}

Status LoadHandle::State::PlaceCpuPieces(uint64_t id, const std::byte* staged) {
  const ReadChunk& chunk = plan.reads[id];
  for (uint32_t t : chunk.tensors) {
    if (DeviceOf(t) >= 0) continue;  // a device piece: its device does it
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
    const auto [lo, hi] = PieceOf(chunk, src);
    Status status = placer_.PlaceOnCpu(t, tensors.data(t), ScalesOf(t),
                                       staged + (lo - chunk.offset), lo, hi);
    if (!status.ok()) return status.WithContext(fmt::format("placing tensor '{}'", src.name));
  }
  return Status::OK();
}

void LoadHandle::State::ConvertStaged(uint64_t id, size_t slot) {
  const auto begin = trace.Now();
  const ReadChunk& chunk = plan.reads[id];
  const std::byte* staged = StagedBytes(id, slot);
  // What the workers do with it, for the trace and the test hook only: a conversion, or a copy.
  Conversion did = Conversion::kNone;
  if (trace.enabled() || hooks_.cancel_at) {
    for (uint32_t t : chunk.tensors) {
      if (DeviceOf(t) < 0 && plan.tensors[t].conversion != Conversion::kNone) {
        did = plan.tensors[t].conversion;
      }
    }
  }
  if (did != Conversion::kNone) CancelIfAskedAt(LoadStage::kConverting);
  Status status;
  if (chunk.shared_buffer) {  // one copy of the whole chunk into its tensors' shared buffer
    status = placer_.PlaceShared(chunk, ReadDestination(id), staged);
    if (!status.ok()) status = chunks_.Error(id, status);
  } else {
    status = PlaceCpuPieces(id, staged);
  }
  if (trace.enabled()) {  // named by what the workers did
    trace.Span(fmt::format("{} {}", did == Conversion::kNone ? "copy" : ConversionName(did),
                           chunks_.Label(id)),
               did == Conversion::kNone ? "copy" : "convert", begin, chunks_.Args(id));
  }
  OnLoop([id, status = std::move(status)](State& self) mutable {
    self.OnStagedDone(id, std::move(status));
  });
}

// A page-cache copy (ReadRoute::kPageCacheCopy), on a worker: the cached bytes of one
// unconverted CPU tensor, or of a shared buffer, straight into its fresh pages (UFFDIO_COPY: the
// kernel reads the mapping) or into the caller's memory (io::CopyFromMapping: streaming stores,
// a page that cannot be read caught as an error, not a SIGBUS). Only unconverted reads come
// here: a conversion reads its source more than once and far slower than a copy.
void LoadHandle::State::CopyCached(uint64_t id, const std::byte* source) {
  const auto begin = trace.Now();
  const ReadChunk& chunk = plan.reads[id];
  std::byte* to = ReadDestination(id);
  // In pieces, each let go of as soon as it is copied: the cached pages a copy maps count in this
  // process's RSS, and a whole 16 MiB read per worker would be most of a small-tensor load's
  // peak above its tensors (bench/README.md, the 100k-tensor checkpoint).
  constexpr uint64_t kPiece = 4ULL << 20;
  Status status;
  for (uint64_t at = 0; at < chunk.length && status.ok(); at += kPiece) {
    const uint64_t n = std::min(kPiece, chunk.length - at);
    status = chunks_[id].copy_when_cached
                 ? io::CopyFromMapping(to + at, source + at, n, chunk.offset + at)
                 : destinations_.fresh_pages().Write(to + at, source + at, n);
    io::ReleaseCachedView(source + at, n);
  }
  // A file cut inside the chunk's last page reads as zeros through the mapping, without a
  // fault: the bytes count only if the file still holds all of them after the copy.
  if (status.ok()) status = CheckFileSize(chunk.file, chunk.offset + chunk.length);
  if (!status.ok() && status.code() != StatusCode::kCorruption) {
    status = Status::IOError(fmt::format(
        "copying from the page cache failed ({}): the file could not be read (an I/O error) "
        "or it shrank while loading; check the disk and the file, then load again",
        status.message()));
  }
  if (trace.enabled()) {
    trace.Span(fmt::format("copy {} (page cache)", chunks_.Label(id)), "copy", begin,
               chunks_.Args(id));
  }
  OnLoop([id, status = std::move(status)](State& self) mutable {
    self.OnCachedDone(id, std::move(status));
  });
}

void LoadHandle::State::OnCachedDone(uint64_t id, Status status) {
  --in_flight_.cached_copies;
  const ReadChunk& chunk = plan.reads[id];
  if (!status.ok()) {
    Fail(chunks_.Error(id, status));
  } else if (!stopping_) {
    bytes_read.fetch_add(chunk.length, std::memory_order_relaxed);
    AdvanceChunk(id);
  }
}

void LoadHandle::State::OnStagedDone(uint64_t id, Status status) {
  --in_flight_.cpu_pieces;
  if (!status.ok()) {
    Fail(std::move(status));
  } else if (!stopping_) {
    AdvanceChunk(id);
  }
  ChunkPartDone(id);
}

}  // namespace loadstone
