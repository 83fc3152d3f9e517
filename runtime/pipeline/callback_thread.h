// One load's callback thread: runs the tasks posted to it one at a time, in the order posted, on
// a thread of its own. The thread starts when a task is posted while none is running, and ends
// once it has had nothing to run for a moment (kLinger) or when this object goes. So a task that
// blocks delays the tasks posted after it here and nothing else, however many threads block, and
// an owner that never posts has no thread at all.
#ifndef LOADSTONE_RUNTIME_PIPELINE_CALLBACK_THREAD_H_
#define LOADSTONE_RUNTIME_PIPELINE_CALLBACK_THREAD_H_

#include <chrono>
#include <functional>
#include <memory>

namespace loadstone::pipeline {

class CallbackThread {
 public:
  using Task = std::function<void()>;
  // How long the thread waits for another task before it ends: a load whose tensors land a few
  // milliseconds apart keeps one thread rather than starting one per tensor.
  static constexpr std::chrono::milliseconds kLinger{100};

  CallbackThread();
  // From another thread: waits until the thread has run every task posted and ended. From the
  // thread itself (a task let go of the last owner of this object): lets it end on its own once
  // that task returns; tasks still queued then are dropped, never run.
  ~CallbackThread();
  CallbackThread(const CallbackThread&) = delete;
  CallbackThread& operator=(const CallbackThread&) = delete;

  // Queues `task`, starting the thread if none runs. Thread-safe; may be called from a task.
  void Post(Task task);
  // Nothing is queued or running (a task counts as running until it has been destroyed).
  // Thread-safe.
  bool Idle() const;
  // Blocks until Idle(). REQUIRES: not called from a task (it would wait for itself).
  void WaitIdle() const;
  // The caller is this object's thread, running one of its tasks.
  bool RunningHere() const;

 private:
  struct Core;
  static void Run(std::shared_ptr<Core> core);
  const std::shared_ptr<Core> core_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_CALLBACK_THREAD_H_
