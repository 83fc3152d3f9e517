// CompletionQueue: finished reads on their way from a Reader backend to its caller, and the
// eventfd that tells the caller so. Shared by every Reader backend.
//
// Thread safety: all methods may be called from any thread, concurrently.
#ifndef LOADSTONE_IO_COMPLETION_QUEUE_H_
#define LOADSTONE_IO_COMPLETION_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "io/event_fd.h"
#include "io/reader.h"
#include "loadstone/status.h"

namespace loadstone::io {

class CompletionQueue {
 public:
  // Errors: IOError when no eventfd can be created.
  static Result<std::unique_ptr<CompletionQueue>> Create();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Counts `n` more requests as outstanding (call before they can complete).
  void AddOutstanding(size_t n) { outstanding_.fetch_add(n, std::memory_order_relaxed); }

  // Hands completions to the caller: each one stops being outstanding. Signals fd().
  void Push(uint64_t tag, Status status);
  void Push(std::vector<ReadCompletion>* batch);  // moves out of *batch and clears it

  // Moves every waiting completion into *out and resets fd(); returns how many.
  size_t Reap(std::vector<ReadCompletion>* out);

  // Readable (non-zero) while completions are waiting.
  int fd() const { return event_.fd(); }

  // Requests counted by AddOutstanding and not yet pushed.
  size_t outstanding() const { return outstanding_.load(std::memory_order_relaxed); }

 private:
  explicit CompletionQueue(EventFd event) : event_(std::move(event)) {}

  const EventFd event_;
  std::atomic<size_t> outstanding_{0};
  std::mutex mu_;
  std::vector<ReadCompletion> ready_;  // guarded by mu_
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_COMPLETION_QUEUE_H_
