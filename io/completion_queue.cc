#include "io/completion_queue.h"

#include <iterator>
#include <utility>

namespace loadstone::io {

Result<std::unique_ptr<CompletionQueue>> CompletionQueue::Create() {
  LOADSTONE_ASSIGN_OR_RETURN(EventFd event, EventFd::Create());
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(std::move(event)));
}

// Only the empty → non-empty transition signals: the counter stays non-zero until Reap().
void CompletionQueue::Push(uint64_t tag, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  ready_.push_back(ReadCompletion{tag, std::move(status)});
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
  if (ready_.size() == 1) event_.Signal();
}

void CompletionQueue::Push(std::vector<ReadCompletion>* batch) {
  if (batch->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  bool was_empty = ready_.empty();
  ready_.insert(ready_.end(), std::make_move_iterator(batch->begin()),
                std::make_move_iterator(batch->end()));
  outstanding_.fetch_sub(batch->size(), std::memory_order_relaxed);
  batch->clear();
  if (was_empty) event_.Signal();
}

size_t CompletionQueue::Reap(std::vector<ReadCompletion>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  event_.Reset();
  size_t reaped = ready_.size();
  out->insert(out->end(), std::make_move_iterator(ready_.begin()),
              std::make_move_iterator(ready_.end()));
  ready_.clear();
  return reaped;
}

}  // namespace loadstone::io
