#include "io/completion_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <iterator>
#include <utility>

#include "io/posix_error.h"

namespace loadstone::io {

Result<std::unique_ptr<CompletionQueue>> CompletionQueue::Create() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", "eventfd");
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(fd));
}

CompletionQueue::~CompletionQueue() { ::close(fd_); }

// Only the empty → non-empty transition needs a signal: the counter stays non-zero until
// Reap() reads it.
void CompletionQueue::SignalLocked() {
  uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(fd_, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
}

void CompletionQueue::Push(uint64_t tag, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_.push_back(ReadCompletion{tag, std::move(status)});
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
  if (ready_.size() == 1) SignalLocked();
}

void CompletionQueue::Push(std::vector<ReadCompletion>* batch) {
  if (batch->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  bool was_empty = ready_.empty();
  ready_.insert(ready_.end(), std::make_move_iterator(batch->begin()),
                std::make_move_iterator(batch->end()));
  outstanding_.fetch_sub(batch->size(), std::memory_order_relaxed);
  batch->clear();
  if (was_empty) SignalLocked();
}

size_t CompletionQueue::Reap(std::vector<ReadCompletion>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t count;
  ssize_t n;
  do {
    n = ::read(fd_, &count, sizeof count);  // non-blocking: EAGAIN when already reset
  } while (n < 0 && errno == EINTR);
  size_t reaped = ready_.size();
  out->insert(out->end(), std::make_move_iterator(ready_.begin()),
              std::make_move_iterator(ready_.end()));
  ready_.clear();
  return reaped;
}

}  // namespace loadstone::io
