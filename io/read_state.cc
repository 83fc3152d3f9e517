#include "io/read_state.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/posix_error.h"

namespace loadstone::io {

PieceCut CutPiece(uint64_t offset, const std::byte* dst, uint64_t remaining,
                  const CutPolicy& policy) {
  const uint64_t chunk = std::min(remaining, policy.max_chunk);
  const uint64_t a = policy.align;
  if (a == 0) return {PieceKind::kBuffered, chunk};
  const uint64_t address = reinterpret_cast<uintptr_t>(dst);
  if (offset % a == address % a) {
    // In phase: the aligned middle goes straight to dst; the head and tail (< a bytes each)
    // through the page cache.
    if (offset % a != 0) return {PieceKind::kBuffered, std::min(remaining, a - offset % a)};
    if (remaining < a) return {PieceKind::kBuffered, remaining};
    const uint64_t max_aligned = std::max(a, policy.max_chunk / a * a);
    return {PieceKind::kDirect, std::min(remaining / a * a, max_aligned)};
  }
  if (policy.bounce_slot >= 2 * a && remaining >= policy.min_bounce) {
    // The superset [offset rounded down, end rounded up] must fit in one slot.
    return {PieceKind::kBounce, std::min(remaining, policy.bounce_slot - offset % a)};
  }
  return {PieceKind::kBuffered, chunk};
}

std::unique_ptr<ReadPiece> TakePiece(const std::shared_ptr<PendingRead>& read, const PieceCut& cut,
                                     uint64_t align, int slot, std::byte* bounce) {
  const ReadRequest& r = read->request;
  const uint64_t offset = r.offset + read->scheduled;
  auto piece = std::make_unique<ReadPiece>();
  piece->read = read;
  piece->kind = cut.kind;
  piece->bytes = cut.length;
  if (cut.kind == PieceKind::kBounce) {
    piece->start = offset / align * align;
    piece->base = bounce;
    piece->want = (offset + cut.length + align - 1) / align * align - piece->start;
    piece->need = offset + cut.length - piece->start;
    piece->slot = slot;
    piece->skip = offset - piece->start;
    piece->dst = r.dst + read->scheduled;
    piece->length = cut.length;
  } else {
    piece->start = offset;
    piece->base = r.dst + read->scheduled;
    piece->want = piece->need = cut.length;
  }
  read->scheduled += cut.length;
  ++read->in_flight;
  return piece;
}

ReadCall NextCall(const ReadPiece& piece, uint64_t align, uint64_t max_read_call) {
  const uint64_t a = align;
  ReadCall call{piece.start + piece.got, piece.base + piece.got, piece.want - piece.got, false};
  call.direct = piece.kind != PieceKind::kBuffered && a > 0 && call.at % a == 0 &&
                reinterpret_cast<uintptr_t>(call.to) % a == 0 && call.length % a == 0;
  if (max_read_call > 0) {
    const uint64_t cap = call.direct ? std::max(a, max_read_call / a * a) : max_read_call;
    call.length = std::min(call.length, cap);
  }
  return call;
}

ReadOutcome ApplyReadResult(ReadPiece& piece, int64_t res, const File& file, StatCounters& stats) {
  PendingRead& read = *piece.read;
  if (res == -EAGAIN || res == -EINTR || (res == -EINVAL && piece.direct_now)) {
    Add(stats.resubmits, 1);
    return res == -EINVAL ? ReadOutcome::kRetryBuffered : ReadOutcome::kRetry;
  }
  const uint64_t at = piece.start + piece.got;
  if (res < 0) {
    read.Fail(ErrnoStatus(static_cast<int>(-res),
                          fmt::format("read {} bytes at offset {} of", piece.asked, at),
                          file.path()));
    return ReadOutcome::kFinished;
  }
  if (res == 0) {
    read.Fail(TruncatedError(file, read.request, at));
    return ReadOutcome::kFinished;
  }
  Add(piece.direct_now ? stats.direct_bytes : stats.buffered_bytes, static_cast<uint64_t>(res));
  piece.got += static_cast<uint64_t>(res);
  if (piece.got < piece.need) {  // a short read is never done: continue where it stopped
    Add(stats.resubmits, 1);
    return ReadOutcome::kRetry;
  }
  if (piece.kind == PieceKind::kBounce && !read.stopped()) {
    std::memcpy(piece.dst, piece.base + piece.skip, piece.length);
    Add(stats.bounced_bytes, piece.length);
  }
  return ReadOutcome::kFinished;
}

std::vector<std::shared_ptr<PendingRead>> Admit(std::span<const ReadRequest> requests,
                                                size_t num_files, CompletionQueue& completions,
                                                StatCounters& stats) {
  completions.AddOutstanding(requests.size());
  Add(stats.requests, requests.size());
  std::vector<std::shared_ptr<PendingRead>> accepted;
  accepted.reserve(requests.size());
  for (const ReadRequest& r : requests) {
    Status bad = CheckRequest(r, num_files);
    if (!bad.ok()) {
      completions.Push(r.tag, std::move(bad));
    } else if (r.length == 0) {
      completions.Push(r.tag, Status::OK());
    } else {
      accepted.push_back(std::make_shared<PendingRead>(r));
    }
  }
  return accepted;
}

ReaderStats StatCounters::Snapshot() const {
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  ReaderStats s;
  s.requests = get(requests);
  s.bytes = get(bytes);
  s.direct_bytes = get(direct_bytes);
  s.buffered_bytes = get(buffered_bytes);
  s.bounced_bytes = get(bounced_bytes);
  s.resubmits = get(resubmits);
  s.peak_bytes_in_flight = get(peak_bytes_in_flight);
  s.network_bytes = get(network_bytes);
  return s;
}

std::string InFlightNote(const ReaderOptions& o) {
  if (o.max_bytes_in_flight == 0) return std::string();
  return fmt::format(", at most {} MiB in flight", (o.max_bytes_in_flight + (1 << 20) - 1) >> 20);
}

Status CheckOptions(const ReaderOptions& o) {
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return Status::InvalidArgument(
        fmt::format("queue_depth {} is out of range (1..4096)", o.queue_depth));
  }
  if (o.max_chunk < (4 << 10) || o.max_chunk > (1ULL << 30)) {
    return Status::InvalidArgument(
        fmt::format("max_chunk {} is out of range (4 KiB..1 GiB)", o.max_chunk));
  }
  if (o.threads < 1 || o.threads > 256) {
    return Status::InvalidArgument(fmt::format("threads {} is out of range (1..256)", o.threads));
  }
  if (o.eagain_every == 1) {
    return Status::InvalidArgument(
        "eagain_every 1 would refuse every read call forever (give 0, or 2 and more)");
  }
  if (o.bounce_bytes > (4ULL << 30)) {
    return Status::InvalidArgument(
        fmt::format("bounce_bytes {} is out of range (0..4 GiB)", o.bounce_bytes));
  }
  return Status::OK();
}

Status CheckRequest(const ReadRequest& r, size_t num_files) {
  if (r.file >= num_files) {
    return Status::InvalidArgument(
        fmt::format("read request for file #{}, but the reader has {} files", r.file, num_files));
  }
  if (r.length > std::numeric_limits<uint64_t>::max() - r.offset) {
    return Status::InvalidArgument(fmt::format(
        "read request of {} bytes at offset {} overflows a 64-bit offset", r.length, r.offset));
  }
  if (r.length > 0 && r.dst == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "read request of {} bytes at offset {} has no destination", r.length, r.offset));
  }
  return Status::OK();
}

Status TruncatedError(const std::string& path, const ReadRequest& r, uint64_t file_end) {
  return Status::Corruption(
      fmt::format("'{}' is truncated: wanted {} bytes at offset {}, the file ends at {}", path,
                  r.length, r.offset, file_end));
}

Status TruncatedError(const File& file, const ReadRequest& r, uint64_t at) {
  struct stat st;
  uint64_t end = at;
  if (::fstat(file.fd(), &st) == 0 && static_cast<uint64_t>(st.st_size) < at) end = st.st_size;
  return TruncatedError(file.path(), r, end);
}

Status CancelledError(const std::string& path, const ReadRequest& r) {
  return Status::Cancelled(
      fmt::format("read of {} bytes at offset {} of '{}' cancelled", r.length, r.offset, path));
}

}  // namespace loadstone::io
