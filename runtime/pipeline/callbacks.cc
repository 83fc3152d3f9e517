#include "runtime/pipeline/callbacks.h"

#include <asio/post.hpp>
#include <exception>

#include <fmt/format.h>

namespace loadstone::pipeline {

Callbacks::Callbacks(asio::thread_pool& pool) : strand_(asio::make_strand(pool.get_executor())) {}

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

void Callbacks::Deliver(std::shared_future<Tensor> tensor) {
  std::lock_guard lock(mu_);
  delivered_.push_back(tensor);
  if (!callbacks_.empty()) {
    asio::post(*strand_, [this, callbacks = callbacks_, tensor] { Run(callbacks, {tensor}); });
  }
}

void Callbacks::OnFailure(std::function<void(Status)> on_failure) { on_failure_ = std::move(on_failure); }

void Callbacks::Run(const std::vector<Callback>& callbacks, const Delivered& tensors) {
  if (!failure_.ok()) return;  // the load is failing: no more callbacks
  for (const auto& ready : tensors) {
    const Tensor& t = ready.get();
    for (const Callback& cb : callbacks) {
      std::string what;
      try {
        cb(t);
        continue;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "an exception that is not a std::exception";
      }
      failure_ = Status::InvalidArgument(
          fmt::format("an on-tensor callback threw for tensor '{}': {}", t.name(), what));
      if (on_failure_) on_failure_(failure_);
      return;
    }
  }
}

void Callbacks::Close(Status result, std::function<void(Status)> finish) {
  std::lock_guard lock(mu_);
  asio::post(*strand_, [this, result = std::move(result), finish = std::move(finish)]() mutable {
    {
      std::lock_guard closing(mu_);
      closed_ = true;
      strand_.reset();  // this handler keeps the strand alive until it returns
    }
    finish(result.ok() && !failure_.ok() ? failure_ : result);
  });
}

}  // namespace loadstone::pipeline
