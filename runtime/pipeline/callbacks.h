// The callbacks of one load: on-tensor callbacks, waiters for one tensor, waiters for the end.
// Invariant: every on-tensor callback sees every tensor exactly once, in completion order, and
// every waiter is called exactly once, all on the load's callback strand — never on the
// event-loop thread that does the I/O bookkeeping — so a callback may be slow, call back into
// its handle (OnTensor, Tensor(name).get()) or throw without stalling or deadlocking the Loader.
#ifndef LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
#define LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_

#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <functional>
#include <future>
#include <mutex>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "loadstone/loader.h"

namespace loadstone::pipeline {

class Callbacks {
 public:
  using Callback = std::function<void(const Tensor&)>;
  using TensorWaiter = std::function<void(Status, Tensor)>;
  using DoneWaiter = std::function<void(Status)>;

  // `pool` runs the callbacks; it outlives every load that has not finished (the Loader's).
  // The load has `tensor_count` tensors, numbered as in its plan.
  Callbacks(asio::thread_pool& pool, size_t tensor_count);

  // Registers `callback`: it gets every tensor delivered so far, then each one as it comes.
  // After Close() has run, the tensors delivered are passed to it at once, on this thread.
  // Thread-safe.
  void Add(Callback callback);
  // Calls `waiter` once: with OK and tensor `index` when it is in place, or with the load's
  // failure when the load ends without it. At once on this thread after Close(). Thread-safe.
  void AddTensorWaiter(uint32_t index, TensorWaiter waiter);
  // Calls `waiter` once with the load's final status (what Close() passes to `finish`), after
  // `finish`; at once on this thread after that. Thread-safe.
  void AddDoneWaiter(DoneWaiter waiter);
  // Tensor `index` is in place (`tensor` is ready). Thread-safe.
  void Deliver(uint32_t index, std::shared_future<Tensor> tensor);
  // `on_failure(status)` is called (from the strand) once, for the first callback that throws:
  // the load fails with that status.
  void OnFailure(std::function<void(Status)> on_failure);
  // After every callback queued so far: `finish(result)`, where result is the first callback
  // failure if `result` is OK and a callback threw, else `result`. Then Add() runs callbacks
  // on the caller's thread. Call once.
  void Close(Status result, std::function<void(Status)> finish);

 private:
  using Delivered = std::vector<std::shared_future<Tensor>>;  // ready futures: no Tensor copies
  void Run(const std::vector<Callback>& callbacks,
           std::span<const std::shared_future<Tensor>> tensors);
  // Calls `waiter`; an exception from it fails the load like one from an on-tensor callback.
  void RunWaiter(const TensorWaiter& waiter, Status status, const Tensor& tensor);
  // The first callback or waiter that threw fails the load (on the strand).
  void FailWith(std::string message);
  // The status a waiter for a tensor that never arrived gets from a load that ended with `end`.
  static Status Missing(const Status& end);

  std::mutex mu_;
  // Released when closed: a handle may outlive its Loader, and with it the pool that a strand
  // belongs to.
  std::optional<asio::strand<asio::thread_pool::executor_type>> strand_;  // guarded by mu_
  // Replaced, never changed, by Add: each delivery posts the list as it is (no copy per tensor).
  std::shared_ptr<const std::vector<Callback>> callbacks_;  // guarded by mu_
  Delivered delivered_;              // guarded by mu_, in completion order
  std::vector<std::shared_future<Tensor>> by_index_;  // guarded by mu_: delivered, by index
  std::unordered_map<uint32_t, std::vector<TensorWaiter>> tensor_waiters_;  // guarded by mu_
  std::vector<DoneWaiter> done_waiters_;  // guarded by mu_
  bool closing_ = false;             // guarded by mu_: Close() has queued its handler
  std::vector<Callback> added_while_closing_;  // guarded by mu_: run by that handler
  bool closed_ = false;              // guarded by mu_
  bool done_called_ = false;         // guarded by mu_: `finish` has returned
  Status final_;                     // guarded by mu_, set when closed
  Status failure_;                   // on the strand only
  std::function<void(Status)> on_failure_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
