#include "runtime/pipeline/callbacks.h"

#include <asio/post.hpp>
#include <cstdio>
#include <exception>

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

// Runs a waiter called as the load ends, when its exception can no longer fail the load: the
// exception is reported on stderr, not let out of the callback thread (which would terminate).
template <typename F>
void RunAfterTheEnd(const F& call) {
  try {
    call();
  } catch (...) {
    fmt::print(stderr, "loadstone: a load's waiter threw after the load had ended: {}\n",
               Describe(std::current_exception()));
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
  callbacks_.push_back(callback);
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
  if (!callbacks_.empty()) {
    asio::post(*strand_, [this, callbacks = callbacks_, tensor] { Run(callbacks, {tensor}); });
  }
  if (auto waiting = tensor_waiters_.extract(index)) {
    asio::post(*strand_, [this, waiters = std::move(waiting.mapped()), tensor] {
      for (const TensorWaiter& waiter : waiters) RunWaiter(waiter, Status::OK(), tensor.get());
    });
  }
}

void Callbacks::RunWaiter(const TensorWaiter& waiter, Status status, const Tensor& tensor) {
  try {
    waiter(std::move(status), tensor);
  } catch (...) {
    if (!failure_.ok()) return;
    failure_ = Status::InvalidArgument(fmt::format("a waiter for tensor '{}' threw: {}",
                                                   tensor.name(), Describe(std::current_exception())));
    if (on_failure_) on_failure_(failure_);
  }
}

Status Callbacks::Missing(const Status& end) {
  return end.ok() ? Status::Corruption("the load ended OK without this tensor (a bug)") : end;
}

void Callbacks::OnFailure(std::function<void(Status)> on_failure) { on_failure_ = std::move(on_failure); }

void Callbacks::Run(const std::vector<Callback>& callbacks, const Delivered& tensors) {
  if (!failure_.ok()) return;  // the load is failing: no more callbacks
  for (const auto& ready : tensors) {
    const Tensor& t = ready.get();
    for (const Callback& cb : callbacks) {
      std::exception_ptr thrown;
      try {
        cb(t);
        continue;
      } catch (...) {
        thrown = std::current_exception();
      }
      failure_ = Status::InvalidArgument(fmt::format("an on-tensor callback threw for tensor '{}': {}",
                                                     t.name(), Describe(thrown)));
      if (on_failure_) on_failure_(failure_);
      return;
    }
  }
}

void Callbacks::Close(Status result, std::function<void(Status)> finish) {
  std::lock_guard lock(mu_);
  asio::post(*strand_, [this, result = std::move(result), finish = std::move(finish)]() mutable {
    const Status end = result.ok() && !failure_.ok() ? failure_ : result;
    std::unordered_map<uint32_t, std::vector<TensorWaiter>> never_delivered;
    {
      std::lock_guard closing(mu_);
      closed_ = true;
      final_ = end;
      never_delivered.swap(tensor_waiters_);
      strand_.reset();  // this handler keeps the strand alive until it returns
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
