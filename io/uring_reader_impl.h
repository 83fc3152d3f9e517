// UringReader::Impl: the state of a UringReader and its ring thread, shared by
// io/uring_reader.cc (the Reader face: Create, Submit, Cancel, ...) and io/uring_thread.cc
// (the ring thread, the only one that touches the ring). Private to loadstone_io.
#ifndef LOADSTONE_IO_URING_READER_IMPL_H_
#define LOADSTONE_IO_URING_READER_IMPL_H_

#include <atomic>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/completion_queue.h"
#include "io/direct_io.h"
#include "io/event_fd.h"
#include "io/read_state.h"
#include "io/uring_reader.h"
#include "io/uring_ring.h"

namespace loadstone::io {

// One UringReader's state: set up by Create, then shared by the callers' threads (under `mu`,
// or atomic) and the ring thread (Run), which alone touches the ring; ~UringReader joins it.
struct UringReader::Impl {
  void Run();  // the ring thread: sets up the ring, then serves it
  bool TakeInbox();
  void Fill();
  std::unique_ptr<ReadPiece> CutNext();
  void Prep(io_uring_sqe* sqe, ReadPiece& piece);
  void ArmWake();
  void Drain();
  void Handle(ReadPiece* raw, int res);
  void Retire(std::unique_ptr<ReadPiece> piece);
  void Break(int err);
  void FailWaiting();
  // Fails every read not yet fully handed to the kernel with why(request).
  template <typename Why>
  void FailQueued(Why why);
  void WaitBroken();
  Status Abandoned(const ReadRequest& r) const;

  std::vector<File> files;
  std::vector<DirectTwin> twins;
  std::vector<CacheProbe> caches;
  std::unique_ptr<std::atomic<bool>[]> direct_ok;  // per file: O_DIRECT open and not refused
  ReaderOptions options;
  std::unique_ptr<CompletionQueue> completions;
  StatCounters stats;
  std::unique_ptr<EagainStorm> storm;  // options.eagain_every (testing)
  EventFd wake;                             // Submit and Cancel → the ring thread
  std::promise<Status> ready;               // the ring's set-up, for Create()
  std::atomic<uint64_t> direct_refused{0};  // O_DIRECT reads the kernel refused (EINVAL)

  std::mutex mu;
  std::vector<std::shared_ptr<PendingRead>> inbox;  // guarded by mu
  bool cancelled = false;                           // guarded by mu
  bool stopping = false;                            // guarded by mu

  // Ring thread only, but for `setup.description`: read by others after `ready`.
  RingSetup setup;
  std::deque<std::shared_ptr<PendingRead>> queue;  // not fully scheduled, in order
  std::deque<std::unique_ptr<ReadPiece>> retry;    // to resubmit (short read, EAGAIN, ...)
  unsigned in_flight = 0;                          // pieces prepared and not yet back
  uint64_t bytes_in_flight = 0;  // the lengths of the pieces cut and not yet retired
  // Set when the kernel refused a submission for good: every read not in the kernel fails
  // with it, and the ring is only waited on, never submitted to again.
  Status broken;
  std::vector<ReadCompletion> done;
  Ring ring;  // after `setup`: torn down before the bounce pool it may have registered

  std::thread thread;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_URING_READER_IMPL_H_
