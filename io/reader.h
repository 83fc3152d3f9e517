// Reader: asynchronous positional reads from a fixed set of files.
//
// A Reader is opened on a list of files (one load's shards). Callers submit batches of
// ReadRequests and collect completions by polling: completion_fd() is an eventfd that becomes
// readable when completions are waiting (the pipeline's Asio loop watches it), and Reap()
// drains them without blocking.
//
// Every request completes exactly once, with OK only when all `length` bytes are in `dst`:
// short reads are continued, EINTR/EAGAIN retried, and an end of file before `length` bytes is
// a Corruption error naming the path, offset and length. Errors carry the path and offset.
//
// Backends: UringReader (io_uring), PreadReader (a thread pool), FaultInjectingReader (a
// wrapper for tests). OpenReader() picks one by probing; the choice is logged.
//
// Thread safety: Submit, Reap and Cancel may be called from any thread, concurrently.
// Lifetime: `dst` buffers must stay valid until their request completes (or until the Reader
// is destroyed; the destructor cancels and waits for in-flight I/O). Once a request's
// completion has been handed out, and once the destructor has returned, the Reader never
// writes into its `dst` again.
//
// O_DIRECT (UringReader): the part of a request whose file offset, length and `dst` address
// are all multiples of the file's direct-I/O alignment (statx STATX_DIOALIGN, else 4096) is
// read with O_DIRECT straight into `dst`; so callers who want that path allocate `dst` with
// `dst % 4096 == offset % 4096`. Other requests are read with O_DIRECT into an aligned bounce
// buffer and copied (ReaderOptions::bounce_bytes), and tiny heads and tails through the page
// cache. On file systems without O_DIRECT (tmpfs) every read goes through the page cache.
// Ranges already (mostly) in the page cache are copied from it rather than read again from the
// device (a warm load runs at memory speed, not disk speed). Both backends turn kernel
// readahead off on their own descriptors: they ask for large explicit ranges themselves.
//
// Tip: leave max_chunk at its default even when the caller plans bigger reads; long requests
// are split anyway, and the chunk size bounds how much is in the kernel's hands at once.
#ifndef LOADSTONE_IO_READER_H_
#define LOADSTONE_IO_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct ReadRequest {
  uint32_t file = 0;       // index into the paths the Reader was opened with
  uint64_t offset = 0;     // byte offset in the file
  uint64_t length = 0;     // bytes to read
  std::byte* dst = nullptr;
  uint64_t tag = 0;        // the caller's cookie, returned with the completion
};

struct ReadCompletion {
  uint64_t tag = 0;
  Status status;
};

struct ReaderStats {
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t direct_bytes = 0;    // read from the device with O_DIRECT (no page cache)
  uint64_t buffered_bytes = 0;  // read through the page cache
  uint64_t bounced_bytes = 0;   // of the requested bytes, those copied out of a bounce buffer
  uint64_t resubmits = 0;       // short reads, EAGAIN, EINTR continued
  uint64_t peak_bytes_in_flight = 0;  // the most bytes of pieces out at once
  uint64_t network_bytes = 0;   // body bytes received over http(s), retried ranges' included
  // `bytes` counts the requested bytes of requests that completed OK; direct_bytes +
  // buffered_bytes count what the OS transferred, which includes the aligned superset around
  // bounced ranges and bytes of requests that later failed.
};

class Reader {
 public:
  virtual ~Reader() = default;

  // "io_uring" or "pread" (plus what the backend does, e.g. "io_uring (O_DIRECT, 64 deep)").
  virtual std::string Describe() const = 0;

  // Queues the requests. Never blocks on I/O; requests beyond the queue depth wait in order.
  // After Cancel(), new requests complete with Cancelled.
  virtual void Submit(std::span<const ReadRequest> requests) = 0;

  // Appends waiting completions to `out` (without blocking) and returns how many.
  virtual size_t Reap(std::vector<ReadCompletion>* out) = 0;

  // An eventfd, readable while completions are waiting. Reap() resets it. It may rarely be
  // readable with nothing to reap (Reap() then returns 0); callers simply wait again.
  virtual int completion_fd() const = 0;

  // Requests not yet completed.
  virtual size_t pending() const = 0;

  // Queued requests complete with Cancelled; in-flight ones finish or are cancelled. Idempotent.
  virtual void Cancel() = 0;

  virtual ReaderStats stats() const = 0;

  // True when reading [offset, offset + length) of `file` now would go to the storage device
  // with O_DIRECT (the file has an O_DIRECT descriptor and the range is not in the page cache).
  // The DMA then lands in the destination's pages as they are: physically scattered 4 KiB pages
  // cut it into small device requests, while reused huge-page staging memory makes large ones
  // (measured in docs/pipeline.md). Thread-safe. Default: false.
  virtual bool ReadsDirect(uint32_t /*file*/, uint64_t /*offset*/, uint64_t /*length*/) const {
    return false;
  }

  // When [offset, offset + length) of `file` is (mostly) in the page cache: a read-only mapping
  // of those bytes, valid while the Reader lives, so that the caller can copy them without a
  // read. Else nullptr. Only for copies done by the kernel (UFFDIO_COPY) or by
  // io::CopyFromMapping: a page that turns out unreadable (an I/O error, a file truncated
  // meanwhile) then fails the copy (EFAULT; a SIGBUS caught by io/mapped_copy.h), where any
  // other touch from user space would crash on SIGBUS. Such copies bypass the Reader: its
  // stats and any fault injection do not see them. Copying maps the page-cache pages into this
  // process (they count in its RSS): ReleaseCachedView(view, length) once the copy is done.
  // Thread-safe. Default: nullptr.
  virtual const std::byte* CachedView(uint32_t /*file*/, uint64_t /*offset*/,
                                      uint64_t /*length*/) const {
    return nullptr;
  }

  // The size now of `file` as this reader opened it (its descriptor, not its path: a file
  // renamed over the path since is not the one read). Thread-safe. Errors: IOError (fstat).
  virtual Result<uint64_t> SizeNow(uint32_t file) const = 0;

  // Called once after a load whose every read succeeded, before the Reader goes: a backend that
  // keeps what it read (HttpReader's Hugging Face cache) completes it, and says what it did for
  // the user; nothing it meets fails the load. It may block on the storage and the network
  // (run it off any event loop); Cancel() from another thread stops it at its next step.
  // Default: nothing to do, "".
  virtual std::string Finish() { return std::string(); }
};

// Drops the pages of [view, view + length) of a CachedView from this process's page tables
// (the page cache keeps them), so that a load that copies a whole model out of the cache does
// not also hold all of it mapped: its peak RSS then stays near the model's size, not twice it.
// Pages only partly inside the range stay mapped. Thread-safe.
void ReleaseCachedView(const std::byte* view, uint64_t length);

// The Hugging Face cache a load of Hub files writes as it streams (io/hub_cache.h): what it is
// given besides the objects.
struct HubCacheTarget {
  std::string root;      // the cache folder (io/location.h HubCacheRoot() for the user's)
  std::string revision;  // the revision the user asked for ("main", a tag); a ref is written
                         // for it unless it is the commit itself; empty: none
  std::vector<std::string> side_files;  // Hub addresses read whole into the cache too (the
                                        // index, config.json)
};

enum class ReaderBackend { kAuto, kUring, kPread };

struct ReaderOptions {
  ReaderBackend backend = ReaderBackend::kAuto;
  // Defaults chosen with bench/reader_bench (bench/README.md): 32 x 4 MiB matches the raw
  // ceiling's setting, keeps 128 MiB in flight (enough for far faster disks) and Cancel() quick.
  int queue_depth = 32;             // reads in flight (1..4096)
  uint64_t max_chunk = 4ULL << 20;  // a request longer than this is split (4 KiB..1 GiB)
  // At most this many bytes of pieces in the kernel's (or the pread threads') hands at once
  // (one piece alone may be more), 0 for no bound but queue_depth (or threads) × max_chunk. A
  // device shares itself among the reads it holds, so a read completes with those submitted
  // after it while they are out: a bound in bytes keeps completions near submission order.
  uint64_t max_bytes_in_flight = 0;
  bool direct = true;               // try O_DIRECT where the file system and alignment allow
  // O_DIRECT bounce buffers (aligned, registered with the ring when possible) for requests
  // whose `dst` is not aligned like their offset; 0 reads those through the page cache.
  uint64_t bounce_bytes = 32ULL << 20;
  int threads = 8;                  // PreadReader's pool size (1..256)
  // The files as the catalog describes them (one per path), or empty: OpenReader then refuses
  // a file that changed since (io::CheckUnchanged), before any read.
  std::vector<CheckpointFile> catalogued;
  // Set: the files are the Hub's (hf:// addresses) and what is read of them is also written to
  // this cache (HttpReader); any other file is refused with InvalidArgument.
  std::optional<HubCacheTarget> hub_cache;
  // Testing only: each read asks the OS for at most this many bytes (0 = no cap), so every
  // chunk is continued exactly as after a short read.
  uint64_t max_read_call = 0;
  // Testing only: every this many read calls (0 = never; 1 is refused) one answers EAGAIN
  // (io_uring: a call that read something is made to), as in a storm of them (a busy NFS server,
  // a cgroup under memory pressure); each is counted as a resubmit and retried.
  uint32_t eagain_every = 0;
  // Testing only (UringReader): after this many calls into the kernel, every submission fails
  // with `fail_submit_errno` (0 = never), as a ring that has gone bad would.
  int fail_submit_errno = 0;
  uint64_t fail_submit_after = 0;
};

// Opens every path and returns the backend `options` asks for. kAuto: io_uring when a ring can
// actually be created, else pread; `*log` (if given) receives one line saying which and why.
// Errors: NotFound / IOError naming the path that could not be opened; InvalidArgument when
// kUring is asked for and io_uring is unavailable (the message says why).
Result<std::unique_ptr<Reader>> OpenReader(const std::vector<std::string>& paths,
                                           const ReaderOptions& options,
                                           std::string* log = nullptr);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_READER_H_
