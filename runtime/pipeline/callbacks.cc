#include "runtime/pipeline/callbacks.h"

#include <asio/post.hpp>
#include <cstdio>
#include <exception>
#include <optional>
#include <span>
#include <string>

#include <fmt/format.h>

namespace loadstone::pipeline {

Callbacks::Callbacks(asio::thread_pool& pool, size_t tensor_count)
    : strand_(asio::make_strand(pool.get_executor())), by_index_(tensor_count) {}

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

// Runs a waiter called as the load ends, when its exception can no longer fail the load: the
// exception is reported on stderr, not let out of the callback thread (which would terminate).
template <typename F>
void RunAfterTheEnd(const F& call) {
  if (auto what = Threw(call)) {
    fmt::print(stderr, "loadstone: a load's waiter threw after the load had ended: {}\n", *what);
  }
}

}  // namespace

// Posting under mu_ keeps the strand's order the order of Add and Deliver.
void Callbacks::Add(Callback callback) {
  std::unique_lock lock(mu_);
  if (closed_) {
    const Delivered all = delivered_;
    lock.unlock();
    for (const auto& t : all) callback(t.get());
    return;
  }
  if (closing_) {
    // Close() has queued its handler on the strand: a replay posted now would run after it, that
    // is after the load's end. The handler runs it first (every tensor is delivered by now).
    added_while_closing_.push_back(std::move(callback));
    return;
  }
  // A new list, so that the lists already posted with tensors stay as they were.
  auto callbacks = callbacks_ ? std::make_shared<std::vector<Callback>>(*callbacks_)
                              : std::make_shared<std::vector<Callback>>();
  callbacks->push_back(callback);
  callbacks_ = std::move(callbacks);
  if (!delivered_.empty()) {
    asio::post(*strand_, [this, callback = std::move(callback), so_far = delivered_] {
      Run({callback}, so_far);
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
  if (delivered.valid()) {
    asio::post(*strand_, [this, waiter = std::move(waiter), delivered] {
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
    asio::post(*strand_, [this, callbacks = callbacks_, tensor] {
      Run(*callbacks, std::span(&tensor, 1));
    });
  }
  if (auto waiting = tensor_waiters_.extract(index)) {
    asio::post(*strand_, [this, waiters = std::move(waiting.mapped()), tensor] {
      for (const TensorWaiter& waiter : waiters) RunWaiter(waiter, Status::OK(), tensor.get());
    });
  }
}

void Callbacks::RunWaiter(const TensorWaiter& waiter, Status status, const Tensor& tensor) {
  if (auto what = Threw([&] { waiter(std::move(status), tensor); })) {
    FailWith(fmt::format("a waiter for tensor '{}' threw: {}", tensor.name(), *what));
  }
}

void Callbacks::FailWith(std::string message) {
  if (!failure_.ok()) return;  // the first failure is the load's
  failure_ = Status::InvalidArgument(std::move(message));
  if (on_failure_) on_failure_(failure_);
}

Status Callbacks::Missing(const Status& end) {
  return end.ok() ? Status::Corruption("the load ended OK without this tensor (a bug)") : end;
}

void Callbacks::OnFailure(std::function<void(Status)> on_failure) { on_failure_ = std::move(on_failure); }

void Callbacks::Run(const std::vector<Callback>& callbacks,
                    std::span<const std::shared_future<Tensor>> tensors) {
  if (!failure_.ok()) return;  // the load is failing: no more callbacks
  for (const auto& ready : tensors) {
    const Tensor& t = ready.get();
    for (const Callback& cb : callbacks) {
      if (auto what = Threw([&] { cb(t); })) {
        return FailWith(
            fmt::format("an on-tensor callback threw for tensor '{}': {}", t.name(), *what));
      }
    }
  }
}

void Callbacks::Close(Status result, std::function<void(Status)> finish) {
  std::lock_guard lock(mu_);
  closing_ = true;
  asio::post(*strand_, [this, result = std::move(result), finish = std::move(finish)]() mutable {
    // Callbacks added since Close() was called (by a callback, say) see every tensor before the
    // end, like those added earlier. The last check and closed_ are one critical section: an Add
    // between them would queue a callback nobody runs.
    Status end;
    std::unordered_map<uint32_t, std::vector<TensorWaiter>> never_delivered;
    for (;;) {
      std::vector<Callback> late;
      Delivered all;
      {
        std::lock_guard closing(mu_);
        if (added_while_closing_.empty()) {
          end = result.ok() && !failure_.ok() ? failure_ : result;  // failure_: this strand's
          closed_ = true;
          final_ = end;
          never_delivered.swap(tensor_waiters_);
          strand_.reset();  // this handler keeps the strand alive until it returns
          break;
        }
        late.swap(added_while_closing_);
        all = delivered_;
      }
      Run(late, all);
    }
    for (const auto& [index, waiters] : never_delivered) {
      for (const TensorWaiter& waiter : waiters) {
        RunAfterTheEnd([&] { waiter(Missing(end), Tensor()); });
      }
    }
    finish(end);
    std::vector<DoneWaiter> done;
    {
      std::lock_guard finished(mu_);
      done_called_ = true;
      done.swap(done_waiters_);
    }
    for (const DoneWaiter& waiter : done) RunAfterTheEnd([&] { waiter(end); });
  });
}

}  // namespace loadstone::pipeline
