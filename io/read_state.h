// Bookkeeping shared by the Reader backends: one request's progress across the pieces it is
// cut into, how the next piece is cut, and the errors every backend reports the same way.
#ifndef LOADSTONE_IO_READ_STATE_H_
#define LOADSTONE_IO_READ_STATE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/reader.h"
#include "loadstone/status.h"

namespace loadstone::io {

// A request being served. Pieces are cut from the front (`scheduled` grows); the request is
// finished once no piece is in flight and either every byte was scheduled or it was stopped
// (failed or cancelled; the first error wins).
// Not thread-safe: each backend guards it with its own lock or keeps it on one thread.
struct PendingRead {
  explicit PendingRead(const ReadRequest& r) : request(r) {}

  uint64_t remaining() const { return request.length - scheduled; }
  bool stopped() const { return !status.ok(); }
  bool fully_scheduled() const { return scheduled == request.length || stopped(); }
  bool finished() const { return in_flight == 0 && fully_scheduled(); }
  void Fail(Status s) {
    if (status.ok()) status = std::move(s);
  }
  // True exactly once: the first time it is asked after the request finished.
  bool TakeCompletion() {
    if (completed || !finished()) return false;
    completed = true;
    return true;
  }

  const ReadRequest request;
  uint64_t scheduled = 0;  // bytes from the front handed to pieces
  uint32_t in_flight = 0;  // pieces handed to the OS (or a worker) and not yet back
  bool completed = false;
  Status status;
};

// ReaderStats as relaxed atomics, updated by whichever thread does the work.
struct StatCounters {
  ReaderStats Snapshot() const;

  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> direct_bytes{0};
  std::atomic<uint64_t> buffered_bytes{0};
  std::atomic<uint64_t> bounced_bytes{0};
  std::atomic<uint64_t> resubmits{0};
  std::atomic<uint64_t> peak_bytes_in_flight{0};
  std::atomic<uint64_t> network_bytes{0};
};

// Raises `peak` to `now` if it is lower (one writer at a time: the ring thread, or under the
// pread reader's lock).
inline void RaisePeak(std::atomic<uint64_t>& peak, uint64_t now) {
  if (now > peak.load(std::memory_order_relaxed)) peak.store(now, std::memory_order_relaxed);
}

inline void Add(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

enum class PieceKind {
  kBuffered,  // through the page cache, straight into dst
  kDirect,    // O_DIRECT straight into dst: offset, length and address aligned
  kBounce,    // O_DIRECT superset read into an aligned bounce buffer, then copied into dst
};

struct CutPolicy {
  uint64_t max_chunk = 16ULL << 20;
  uint64_t align = 0;              // direct-I/O alignment of the file; 0: no O_DIRECT for it
  uint64_t bounce_slot = 0;        // bytes per bounce buffer; 0: no bounce buffers
  uint64_t min_bounce = 64 << 10;  // smaller misaligned pieces go through the page cache
};

struct PieceCut {
  PieceKind kind;
  uint64_t length;  // bytes of the request this piece delivers (> 0)
};

// The next piece of a request whose unscheduled part starts at file `offset`, goes to `dst`
// and is `remaining` bytes long. REQUIRES: remaining > 0.
PieceCut CutPiece(uint64_t offset, const std::byte* dst, uint64_t remaining,
                  const CutPolicy& policy);

// One read handed to the OS: [start, start + want) of the file into `base`. Done once `need`
// bytes arrived (less than `want` only for a bounce superset that runs past the end of the
// file); a bounce piece then copies base[skip, skip + length) to `dst`.
struct ReadPiece {
  std::shared_ptr<PendingRead> read;
  PieceKind kind = PieceKind::kBuffered;
  uint64_t start = 0;
  std::byte* base = nullptr;
  uint64_t want = 0;
  uint64_t need = 0;
  uint64_t got = 0;
  int slot = -1;  // bounce slot
  uint64_t skip = 0;
  std::byte* dst = nullptr;
  uint64_t length = 0;
  bool cached = false;      // mostly in the page cache when cut
  bool direct_now = false;  // the submission in flight went to the O_DIRECT descriptor
  uint64_t asked = 0;       // bytes the submission in flight asked for
  uint64_t bytes = 0;       // the request's bytes this piece reads (its cut's length)
};

// Schedules the next `cut.length` bytes of `read` as a piece. For a kBounce cut, `bounce` is
// the slot's memory (index `slot`) and `align` the file's O_DIRECT alignment.
// REQUIRES: !read->fully_scheduled().
std::unique_ptr<ReadPiece> TakePiece(const std::shared_ptr<PendingRead>& read, const PieceCut& cut,
                                     uint64_t align, int slot, std::byte* bounce);

// The next read call of `piece`: `length` bytes at file offset `at` into `to`, with O_DIRECT
// when the piece may use it and offset, address and length are multiples of `align` (> 0).
// `max_read_call` (0: none) caps the length, to a multiple of `align` for a direct call.
struct ReadCall {
  uint64_t at = 0;
  std::byte* to = nullptr;
  uint64_t length = 0;
  bool direct = false;
};
ReadCall NextCall(const ReadPiece& piece, uint64_t align, uint64_t max_read_call);

// ReaderOptions::eagain_every: Hit() is true for every `every`-th call (never when 0).
// Thread-safe.
class EagainStorm {
 public:
  explicit EagainStorm(uint32_t every) : every_(every) {}
  bool Hit() { return every_ != 0 && calls_.fetch_add(1, std::memory_order_relaxed) % every_ == 0; }

 private:
  const uint32_t every_;
  std::atomic<uint64_t> calls_{0};
};

enum class ReadOutcome {
  kFinished,       // every byte arrived (and was copied out of the bounce slot), or it failed
  kRetry,          // submit the rest again (short read, EAGAIN, EINTR)
  kRetryBuffered,  // O_DIRECT refused (EINVAL): submit again through the page cache
};

// Applies the result of one read call of `piece` (bytes, or -errno) from `file`: counts the
// bytes, continues short reads, records failures (IOError / Corruption naming the path,
// offset and length) on the piece's request, and copies a finished bounce piece to its dst.
ReadOutcome ApplyReadResult(ReadPiece& piece, int64_t res, const File& file, StatCounters& stats);

class CompletionQueue;

// Counts `requests` as submitted and outstanding, completes at once those that need no I/O
// (invalid ones: InvalidArgument; empty ones: OK) and returns the rest, in order.
std::vector<std::shared_ptr<PendingRead>> Admit(std::span<const ReadRequest> requests,
                                                size_t num_files, CompletionQueue& completions,
                                                StatCounters& stats);

// queue_depth, max_chunk, threads and bounce_bytes within their documented ranges;
// InvalidArgument naming the option otherwise.
Status CheckOptions(const ReaderOptions& options);
// ", at most N MiB in flight" for a reader's description when max_bytes_in_flight bounds it.
std::string InFlightNote(const ReaderOptions& options);

// The checks every backend makes before queueing: the file index exists, offset + length does
// not overflow, dst is set when length > 0. InvalidArgument otherwise.
Status CheckRequest(const ReadRequest& r, size_t num_files);

// Corruption: `path` ended at `file_end` inside the request.
Status TruncatedError(const std::string& path, const ReadRequest& r, uint64_t file_end);
// The same, for a read of `file` that returned 0 bytes at `at`: the message gives the file's
// size now (it may have been truncated after it was opened).
Status TruncatedError(const File& file, const ReadRequest& r, uint64_t at);

// Cancelled, naming what was not (completely) read.
Status CancelledError(const std::string& path, const ReadRequest& r);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_READ_STATE_H_
