#include "runtime/pipeline/callback_thread.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace loadstone::pipeline {

// Shared by the owner and its thread, so that the thread can finish a task that destroyed the
// owner (and return) without touching freed memory.
struct CallbackThread::Core {
  mutable std::mutex mu;
  std::condition_variable wake;          // a task was posted, or the owner is going
  mutable std::condition_variable idle;  // nothing is queued or running
  std::deque<Task> queue;                // guarded by mu
  bool busy = false;                     // guarded by mu: a task taken off the queue is not yet destroyed
  bool running = false;                  // guarded by mu: the thread has not yet left Run's loop
  bool owner_gone = false;               // guarded by mu
  std::thread thread;                    // guarded by mu; joined by the owner, or detached
};

namespace {

// The Core whose task this thread is running, if it is a callback thread.
thread_local const void* running_here = nullptr;

}  // namespace

CallbackThread::CallbackThread() : core_(std::make_shared<Core>()) {}

CallbackThread::~CallbackThread() {
  std::unique_lock lock(core_->mu);
  core_->owner_gone = true;
  if (RunningHere()) {
    core_->queue.clear();
    core_->thread.detach();  // its Core stays alive through the thread's own reference
    return;
  }
  std::thread thread = std::move(core_->thread);
  lock.unlock();
  core_->wake.notify_all();
  if (thread.joinable()) thread.join();
}

void CallbackThread::Post(Task task) {
  std::lock_guard lock(core_->mu);
  core_->queue.push_back(std::move(task));
  if (core_->running) {
    core_->wake.notify_one();
    return;
  }
  // The last thread left its loop holding mu and touches nothing of this object after: joining
  // it here is waiting for a return.
  if (core_->thread.joinable()) core_->thread.join();
  core_->thread = std::thread(&CallbackThread::Run, core_);  // it waits for mu
  core_->running = true;
}

bool CallbackThread::Idle() const {
  std::lock_guard lock(core_->mu);
  return core_->queue.empty() && !core_->busy;
}

void CallbackThread::WaitIdle() const {
  std::unique_lock lock(core_->mu);
  core_->idle.wait(lock, [&] { return core_->queue.empty() && !core_->busy; });
}

bool CallbackThread::RunningHere() const { return running_here == core_.get(); }

void CallbackThread::Run(std::shared_ptr<Core> core) {
  running_here = core.get();
  std::unique_lock lock(core->mu);
  for (;;) {
    if (core->queue.empty()) {
      core->idle.notify_all();
      const bool more = core->wake.wait_for(lock, kLinger, [&] {
        return !core->queue.empty() || core->owner_gone;
      });
      if (!more || core->queue.empty()) break;  // lingered long enough, or the owner is going
    }
    Task task = std::move(core->queue.front());
    core->queue.pop_front();
    core->busy = true;
    lock.unlock();
    task();
    task = nullptr;  // what it holds (the load's state, say) is let go before the lock is taken
    lock.lock();
    core->busy = false;
  }
  core->running = false;
  running_here = nullptr;
}

}  // namespace loadstone::pipeline
