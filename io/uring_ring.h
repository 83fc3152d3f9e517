// Ring: one io_uring instance (liburing) that knows which prepared entries the kernel has not
// taken yet. A ring that refuses submissions for good can then hand them back: their buffers
// were never seen by the kernel, so they may be released at once (UringReader).
//
// Not thread-safe: one thread prepares, submits and reaps (the ring is single-issuer).
#ifndef LOADSTONE_IO_URING_RING_H_
#define LOADSTONE_IO_URING_RING_H_

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "io/direct_io.h"
#include "io/file.h"
#include "io/reader.h"
#include "loadstone/status.h"

namespace loadstone::io {

// "cannot create an io_uring ring: <strerror>" plus a hint for the usual causes.
std::string RingError(int err);

// OK when a ring can be created here and supports IORING_OP_READ; otherwise Unsupported.
Status ProbeRing();

class Ring {
 public:
  Ring() = default;
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Returns 0 or -errno.
  int Init(unsigned entries, unsigned flags);
  io_uring* get() { return &ring_; }

  // A free submission entry, flushing a full queue once; nullptr when there is none.
  io_uring_sqe* GetSqe();
  // Records a prepared entry with its user data (nullptr allowed): it counts as not yet taken
  // until a Submit() covers it.
  void Queued(io_uring_sqe* sqe, void* data);
  // io_uring_submit_and_wait (wait_nr 0: io_uring_submit). Returns what liburing returns: how
  // many entries the kernel took (the oldest ones), or -errno and none taken.
  int Submit(unsigned wait_nr);
  // Blocks for a completion without submitting anything. Returns 0 or -errno.
  int WaitWithoutSubmitting();
  // The user data of every entry the kernel has not taken, oldest first; they stay in the
  // submission queue, so the caller must not Submit() again.
  std::deque<void*> TakeUnsubmitted();

  // Testing only: after `calls` calls to Submit(), each one fails with -err, taking nothing.
  void RefuseAfter(uint64_t calls, int err) {
    refuse_after_ = calls;
    refuse_errno_ = err;
  }

 private:
  io_uring ring_{};
  bool live_ = false;
  std::deque<void*> unsubmitted_;
  uint64_t submit_calls_ = 0;
  uint64_t refuse_after_ = 0;
  int refuse_errno_ = 0;
};

// What SetUpRing made of a ring for a reader's files.
struct RingSetup {
  BouncePool pool;  // O_DIRECT bounce slots; empty without O_DIRECT or memory for them
  bool files_registered = false;    // fixed files: each file, then its O_DIRECT twin (or itself)
  bool buffers_registered = false;  // the pool as one fixed buffer
  std::string description;          // "io_uring (32 deep, 4 MiB chunks, O_DIRECT ready on 8/8 ...)"
};

// Creates `ring` with room for `options.queue_depth` reads and a wake-up poll (single-issuer
// with deferred task running where the kernel has them), registers the files and a bounce
// pool; arms the ring's testing refusal (ReaderOptions::fail_submit_*). Registration failures
// are only noted in the description; Unsupported when no ring can be created.
Result<RingSetup> SetUpRing(Ring& ring, const std::vector<File>& files,
                            const std::vector<DirectTwin>& twins, const ReaderOptions& options);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_URING_RING_H_
