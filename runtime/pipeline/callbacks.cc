#include "runtime/pipeline/callbacks.h"

#include <exception>
#include <optional>
#include <span>
#include <string>

#include <fmt/format.h>

namespace loadstone::pipeline {

Callbacks::Callbacks(size_t tensor_count) : by_index_(tensor_count) {}

namespace {

// What escaped a callback, for the load's error.
std::string Describe(std::exception_ptr thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Calls `call`: what it threw, described, or nothing.
template <typename F>
std::optional<std::string> Threw(const F& call) {
  try {
    call();
    return std::nullopt;
  } catch (...) {
    return Describe(std::current_exception());
  }
}

}  // namespace

// Posting under mu_ keeps the thread's order the order of Add and Deliver.
void Callbacks::Add(Callback callback, Kind kind) {
  std::unique_lock lock(mu_);
  if (closed_) {
    const Delivered all = delivered_;
    lock.unlock();
    for (const auto& t : all) callback(t.get());
    return;
  }
  if (closing_) {
    // Close() has queued its work: a replay posted now would run after it, that is after the
    // load's end. That work runs it first (every tensor is delivered by now).
    added_while_closing_.push_back({std::move(callback), kind});
    return;
  }
  // A new list, so that the lists already posted with tensors stay as they were.
  auto callbacks = callbacks_ ? std::make_shared<List>(*callbacks_) : std::make_shared<List>();
  callbacks->push_back({callback, kind});
  callbacks_ = std::move(callbacks);
  if (!delivered_.empty()) {
    thread_.Post([this, one = List{{std::move(callback), kind}}, so_far = delivered_] {
      Run(one, so_far);
    });
  }
}

void Callbacks::AddTensorWaiter(uint32_t index, TensorWaiter waiter) {
  std::unique_lock lock(mu_);
  const std::shared_future<Tensor> delivered = by_index_.at(index);
  if (closed_) {
    const Status end = final_;
    lock.unlock();
    if (delivered.valid()) {
      waiter(Status::OK(), delivered.get());
    } else {
      waiter(Missing(end), Tensor());
    }
    return;
  }
  if (delivered.valid() && closing_) {  // like Add while closing: before the end
    waiting_while_closing_.emplace_back(std::move(waiter), delivered);
    return;
  }
  if (delivered.valid()) {
    thread_.Post([this, waiter = std::move(waiter), delivered] {
      RunWaiter(waiter, Status::OK(), delivered.get());
    });
    return;
  }
  tensor_waiters_[index].push_back(std::move(waiter));
}

void Callbacks::AddDoneWaiter(DoneWaiter waiter) {
  std::unique_lock lock(mu_);
  if (done_called_) {
    const Status end = final_;
    lock.unlock();
    waiter(end);
    return;
  }
  done_waiters_.push_back(std::move(waiter));
}

void Callbacks::Deliver(uint32_t index, std::shared_future<Tensor> tensor) {
  std::lock_guard lock(mu_);
  delivered_.push_back(tensor);
  by_index_.at(index) = tensor;
  if (callbacks_) {
    thread_.Post([this, callbacks = callbacks_, tensor] { Run(*callbacks, std::span(&tensor, 1)); });
  }
  if (auto waiting = tensor_waiters_.extract(index)) {
    thread_.Post([this, waiters = std::move(waiting.mapped()), tensor] {
      for (const TensorWaiter& waiter : waiters) RunWaiter(waiter, Status::OK(), tensor.get());
    });
  }
}

void Callbacks::RunWaiter(const TensorWaiter& waiter, Status status, const Tensor& tensor) {
  if (auto what = Threw([&] { waiter(std::move(status), tensor); })) {
    FailWith(fmt::format("an OnTensorReady callback for tensor '{}' threw: {}", tensor.name(),
                         *what));
  }
}

template <typename F>
void Callbacks::RunLate(const F& call, const char* what) {
  if (auto thrown = Threw(call)) {
    std::lock_guard lock(mu_);
    if (late_failures_++ == 0) {
      first_late_failure_ = fmt::format("{} threw after the load had ended: {}", what, *thrown);
    }
  }
}

Status Callbacks::LateFailure() const {
  std::lock_guard lock(mu_);
  if (late_failures_ == 0) return Status::OK();
  return Status::CallbackFailed(
      fmt::format("{} ({} callback{} threw after the end in all; Done() is not changed by that)",
                  first_late_failure_, late_failures_, late_failures_ == 1 ? "" : "s"));
}

void Callbacks::FailWith(std::string message) {
  std::function<void(Status)> on_failure;
  Status failure;
  {
    std::lock_guard lock(mu_);
    if (!failure_.ok()) return;  // the first failure is the load's
    failure_ = Status::CallbackFailed(std::move(message));
    failure = failure_;
    on_failure = on_failure_;
  }
  if (on_failure) on_failure(std::move(failure));
}

Status Callbacks::Missing(const Status& end) {
  return end.ok() ? Status::Corruption("the load ended OK without this tensor (a bug)") : end;
}

void Callbacks::OnFailure(std::function<void(Status)> on_failure) {
  std::lock_guard lock(mu_);
  on_failure_ = std::move(on_failure);
}

void Callbacks::Abandon() {
  std::lock_guard lock(mu_);
  abandoned_ = true;
}

void Callbacks::Run(const List& callbacks, std::span<const std::shared_future<Tensor>> tensors) {
  for (const auto& ready : tensors) {
    {
      std::lock_guard lock(mu_);
      if (!failure_.ok() || abandoned_) return;  // the load is failing, or nobody listens
    }
    const Tensor& t = ready.get();
    for (const Named& cb : callbacks) {
      if (auto what = Threw([&] { cb.call(t); })) {
        return FailWith(cb.kind == Kind::kOnProgress
                            ? fmt::format("LoadOptions::on_progress threw after tensor '{}': {}",
                                          t.name(), *what)
                            : fmt::format("an on-tensor callback threw for tensor '{}': {}",
                                          t.name(), *what));
      }
    }
  }
}

Status Callbacks::EndOf(const Status& result) const {
  return result.ok() && !failure_.ok() ? failure_ : result;
}

void Callbacks::Close(Status result, std::function<void(Status)> finish) {
  std::unique_lock lock(mu_);
  if (thread_.Idle() && tensor_waiters_.empty() && done_waiters_.empty()) {
    // Every callback has returned and nobody waits: the end needs no callback thread. (Posts
    // happen under mu_, so none can slip in before closed_ is set.)
    const Status end = EndOf(result);
    closed_ = true;
    final_ = end;
    lock.unlock();
    return Finish(end, std::move(finish));
  }
  closing_ = true;
  thread_.Post([this, result = std::move(result), finish = std::move(finish)]() mutable {
    CloseOnThread(result, finish);
  });
}

void Callbacks::CloseOnThread(const Status& result, const std::function<void(Status)>& finish) {
  // Callbacks and waiters added since Close() was called (by a callback, say) see every tensor
  // before the end, like those added earlier. The last check and closed_ are one critical
  // section: an Add between them would queue a callback nobody runs.
  Status end;
  std::unordered_map<uint32_t, std::vector<TensorWaiter>> never_delivered;
  for (;;) {
    std::vector<Named> late;
    std::vector<std::pair<TensorWaiter, std::shared_future<Tensor>>> waiting;
    Delivered all;
    {
      std::lock_guard closing(mu_);
      if (added_while_closing_.empty() && waiting_while_closing_.empty()) {
        end = EndOf(result);
        closed_ = true;
        final_ = end;
        never_delivered.swap(tensor_waiters_);
        break;
      }
      late.swap(added_while_closing_);
      waiting.swap(waiting_while_closing_);
      all = delivered_;
    }
    Run(late, all);
    for (const auto& [waiter, tensor] : waiting) RunWaiter(waiter, Status::OK(), tensor.get());
  }
  for (const auto& [index, waiters] : never_delivered) {
    for (const TensorWaiter& waiter : waiters) {
      RunLate([&] { waiter(Missing(end), Tensor()); },
              "an OnTensorReady callback told the load ended without its tensor");
    }
  }
  finish(end);
  std::vector<DoneWaiter> done;
  {
    std::lock_guard finished(mu_);
    done_called_ = true;
    done.swap(done_waiters_);
  }
  RunDoneWaiters(done, end);
  MarkEnded();
}

void Callbacks::Finish(const Status& end, std::function<void(Status)> finish) {
  finish(end);
  std::vector<DoneWaiter> done;
  {
    std::lock_guard finished(mu_);
    done_called_ = true;
    done.swap(done_waiters_);
    if (!done.empty()) {
      // Added while `finish` ran: called on the callback thread, which holds the load meanwhile.
      thread_.Post([this, done = std::move(done), end, finish = std::move(finish)] {
        RunDoneWaiters(done, end);
        MarkEnded();
      });
      return;
    }
  }
  MarkEnded();
}

void Callbacks::RunDoneWaiters(const std::vector<DoneWaiter>& waiters, const Status& end) {
  for (const DoneWaiter& waiter : waiters) RunLate([&] { waiter(end); }, "an OnDone callback");
}

void Callbacks::MarkEnded() {
  {
    std::lock_guard lock(mu_);
    ended_ = true;
  }
  ended_cv_.notify_all();
}

void Callbacks::WaitEnded() {
  {
    std::unique_lock lock(mu_);
    ended_cv_.wait(lock, [&] { return ended_; });
  }
  thread_.WaitIdle();
}

}  // namespace loadstone::pipeline
