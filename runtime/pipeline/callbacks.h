// The callbacks of one load: on-tensor callbacks, waiters for one tensor, waiters for the end.
// Invariant: every on-tensor callback sees every tensor exactly once, in completion order, and
// every waiter is called exactly once, all on the load's own callback thread (callback_thread.h)
// — never on the event-loop thread that does the I/O bookkeeping, never on a thread another load
// uses — so a callback may be slow, block, call back into its handle (OnTensor,
// Tensor(name).get()) or throw without stalling or deadlocking the Loader or another load. A load
// with no callbacks never starts that thread: Close() then ends it on the caller's thread.
#ifndef LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
#define LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstone/loader.h"
#include "runtime/pipeline/callback_thread.h"

namespace loadstone::pipeline {

class Callbacks {
 public:
  using Callback = std::function<void(const Tensor&)>;
  using TensorWaiter = std::function<void(Status, Tensor)>;
  using DoneWaiter = std::function<void(Status)>;
  // Which callback a throw is reported as.
  enum class Kind { kOnTensor, kOnProgress };

  // The load has `tensor_count` tensors, numbered as in its plan.
  explicit Callbacks(size_t tensor_count);

  // Registers `callback`: it gets every tensor delivered so far, then each one as it comes.
  // After Close() has run, the tensors delivered are passed to it at once, on this thread.
  // Thread-safe.
  void Add(Callback callback, Kind kind = Kind::kOnTensor);
  // Calls `waiter` once: with OK and tensor `index` when it is in place, or with the load's
  // failure when the load ends without it. At once on this thread after Close(). Thread-safe.
  void AddTensorWaiter(uint32_t index, TensorWaiter waiter);
  // Calls `waiter` once with the load's final status (what Close() passes to `finish`), after
  // `finish`; at once on this thread after that. Thread-safe.
  void AddDoneWaiter(DoneWaiter waiter);
  // Tensor `index` is in place (`tensor` is ready). Thread-safe.
  void Deliver(uint32_t index, std::shared_future<Tensor> tensor);
  // `on_failure(status)` is called (from the callback thread) once, for the first callback
  // that throws: the load fails with that status (CallbackFailed).
  void OnFailure(std::function<void(Status)> on_failure);
  // After every callback queued so far: `finish(result)`, where result is the first callback
  // failure if `result` is OK and a callback threw, else `result`; then the done waiters. On
  // this thread when nothing is queued or running and no waiter waits, else on the callback
  // thread. `finish` (and what it holds: the load) is kept until the last waiter has returned.
  // Then Add() runs callbacks on the caller's thread. Call once.
  void Close(Status result, std::function<void(Status)> finish);

  // The caller is this load's callback thread.
  bool OnItsThread() const { return thread_.RunningHere(); }
  // No on-tensor callback is called from now on (its handle is gone); waiters still are.
  void Abandon();
  // Blocks until Close()'s work is done: `finish` and every done waiter have returned and the
  // callback thread holds nothing of the load. REQUIRES: Close() is called; not on its thread.
  void WaitEnded();
  // OK, or CallbackFailed naming the first waiter that threw once the load's end was decided
  // (it can no longer fail the load) and how many did.
  Status LateFailure() const;

 private:
  using Delivered = std::vector<std::shared_future<Tensor>>;  // ready futures: no Tensor copies
  struct Named {
    Callback call;
    Kind kind;
  };
  using List = std::vector<Named>;
  void Run(const List& callbacks, std::span<const std::shared_future<Tensor>> tensors);
  // Calls `waiter`; an exception from it fails the load like one from an on-tensor callback.
  void RunWaiter(const TensorWaiter& waiter, Status status, const Tensor& tensor);
  // Calls `waiter` for a load whose end is decided: an exception from it is counted (LateFailure).
  template <typename F>
  void RunLate(const F& call, const char* what);
  // The first callback or waiter that threw fails the load.
  void FailWith(std::string message);
  // The end of a load that ended with `result` (mu_ held).
  Status EndOf(const Status& result) const;
  // Close()'s work on the callback thread.
  void CloseOnThread(const Status& result, const std::function<void(Status)>& finish);
  // `finish`, then the done waiters; `finish` is held (it holds the load) until they return.
  void Finish(const Status& end, std::function<void(Status)> finish);
  void RunDoneWaiters(const std::vector<DoneWaiter>& waiters, const Status& end);
  void MarkEnded();
  // The status a waiter for a tensor that never arrived gets from a load that ended with `end`.
  static Status Missing(const Status& end);

  mutable std::mutex mu_;
  // Replaced, never changed, by Add: each delivery posts the list as it is (no copy per tensor).
  std::shared_ptr<const List> callbacks_;  // guarded by mu_
  Delivered delivered_;              // guarded by mu_, in completion order
  std::vector<std::shared_future<Tensor>> by_index_;  // guarded by mu_: delivered, by index
  std::unordered_map<uint32_t, std::vector<TensorWaiter>> tensor_waiters_;  // guarded by mu_
  std::vector<DoneWaiter> done_waiters_;  // guarded by mu_
  bool closing_ = false;             // guarded by mu_: Close() has queued its work
  // Guarded by mu_: registered while closing, run by Close()'s work before the end.
  std::vector<Named> added_while_closing_;
  std::vector<std::pair<TensorWaiter, std::shared_future<Tensor>>> waiting_while_closing_;
  bool closed_ = false;              // guarded by mu_
  bool done_called_ = false;         // guarded by mu_: `finish` has returned
  bool ended_ = false;               // guarded by mu_: the done waiters have returned too
  std::condition_variable ended_cv_;
  bool abandoned_ = false;           // guarded by mu_
  Status final_;                     // guarded by mu_, set when closed
  Status failure_;                   // guarded by mu_
  std::function<void(Status)> on_failure_;  // guarded by mu_
  size_t late_failures_ = 0;         // guarded by mu_
  std::string first_late_failure_;   // guarded by mu_
  CallbackThread thread_;            // last: destroyed (joined) first
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_CALLBACKS_H_
