// The on-tensor callbacks of one load. Invariant: every callback sees every tensor exactly once,
// in completion order, on the load's callback strand — never on the event-loop thread that does
// the I/O bookkeeping — so a callback may be slow, call back into its handle (OnTensor,
// Tensor(name).get()) or throw without stalling or deadlocking the Loader.
#ifndef LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
#define LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_

#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include "loadstone/loader.h"

namespace loadstone::pipeline {

class Callbacks {
 public:
  using Callback = std::function<void(const Tensor&)>;

  // `pool` runs the callbacks; it outlives every load that has not finished (the Loader's).
  explicit Callbacks(asio::thread_pool& pool);

  // Registers `callback`: it gets every tensor delivered so far, then each one as it comes.
  // After Close() has run, the tensors delivered are passed to it at once, on this thread.
  // Thread-safe.
  void Add(Callback callback);
  // A tensor is in place (`tensor` is ready). Thread-safe.
  void Deliver(std::shared_future<Tensor> tensor);
  // `on_failure(status)` is called (from the strand) once, for the first callback that throws:
  // the load fails with that status.
  void OnFailure(std::function<void(Status)> on_failure);
  // After every callback queued so far: `finish(result)`, where result is the first callback
  // failure if `result` is OK and a callback threw, else `result`. Then Add() runs callbacks
  // on the caller's thread. Call once.
  void Close(Status result, std::function<void(Status)> finish);

 private:
  using Delivered = std::vector<std::shared_future<Tensor>>;  // ready futures: no Tensor copies
  void Run(const std::vector<Callback>& callbacks, const Delivered& tensors);

  std::mutex mu_;
  // Released when closed: a handle may outlive its Loader, and with it the pool that a strand
  // belongs to.
  std::optional<asio::strand<asio::thread_pool::executor_type>> strand_;  // guarded by mu_
  std::vector<Callback> callbacks_;  // guarded by mu_
  Delivered delivered_;              // guarded by mu_, in completion order
  bool closed_ = false;              // guarded by mu_
  Status failure_;                   // on the strand only
  std::function<void(Status)> on_failure_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
