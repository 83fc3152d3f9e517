// For tests of callbacks that block: a gate they wait on, bounded waits, a watchdog, and a small
// checkpoint that loads in milliseconds (under the sanitizers too).
#ifndef LOADSTONE_TESTS_RUNTIME_PIPELINE_CALLBACK_TEST_UTIL_H_
#define LOADSTONE_TESTS_RUNTIME_PIPELINE_CALLBACK_TEST_UTIL_H_

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "test_model.h"

namespace loadstone::testing {

// How long a test waits for what must happen: far longer than it takes under TSan.
constexpr auto kBound = std::chrono::seconds(30);

inline bool Resolves(const std::shared_future<Status>& done) {
  return done.wait_for(kBound) == std::future_status::ready;
}

// Whether `condition` holds within kBound (polled).
template <typename Condition>
bool Eventually(Condition condition) {
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Callbacks Wait() on it until the test opens it. Open() may be called any number of times.
class Gate {
 public:
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Opens the gate when it goes: declared after the handles whose callbacks wait on the gate, it
// lets them finish before their destructors wait for them (a failed REQUIRE included).
class OpenOnExit {
 public:
  explicit OpenOnExit(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  ~OpenOnExit() { gate_->Open(); }
  OpenOnExit(const OpenOnExit&) = delete;
  OpenOnExit& operator=(const OpenOnExit&) = delete;

 private:
  std::shared_ptr<Gate> gate_;
};

// Aborts the run, saying `what`, unless destroyed within `limit`: a hang fails at once.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit)
      : thread_([this, what = std::move(what), limit] {
          std::unique_lock lock(mu_);
          if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s: still running after %lld s: hung\n", what.c_str(),
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the rest is built
};

// Six small tensors in one file, and their default plan.
struct SmallModel {
  static Checkpoint Write(const TempDir& dir, std::vector<std::vector<std::byte>>& data) {
    std::vector<TensorToWrite> tensors;
    for (int i = 0; i < 6; ++i) {
      data.emplace_back(1024u << i);
      for (size_t k = 0; k < data.back().size(); ++k) data.back()[k] = PatternByte(i, k);
    }
    for (int i = 0; i < 6; ++i) {
      tensors.push_back({"layers." + std::to_string(i) + ".weight", DType::kU8,
                         {data[i].size()}, data[i], {}});
    }
    return WriteAndOpen(dir, tensors, 1ULL << 30);
  }
  TempDir dir;
  std::vector<std::vector<std::byte>> data;
  Checkpoint ckpt = Write(dir, data);
  LoadPlan plan = MixedModel::PlanOf(ckpt);
};

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_CALLBACK_TEST_UTIL_H_
