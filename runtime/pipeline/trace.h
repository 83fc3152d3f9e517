// Records pipeline events in the Chrome trace-event format (open the file in Perfetto).
#ifndef LOADSTONE_RUNTIME_PIPELINE_TRACE_H_
#define LOADSTONE_RUNTIME_PIPELINE_TRACE_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "loadstone/status.h"

namespace loadstone::pipeline {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  explicit TraceRecorder(bool enabled) : enabled_(enabled), start_(Clock::now()) {}
  bool enabled() const { return enabled_; }
  Clock::time_point Now() const { return Clock::now(); }

  // A complete event ("ph":"X") from `begin` to now on the calling thread. Thread-safe.
  void Span(std::string name, const char* category, Clock::time_point begin, std::string args = "");
  // A complete event from `begin` to `end` on the named track (e.g. "cuda:0 copy stream"),
  // which the file labels with that name. Thread-safe.
  void SpanOnTrack(std::string name, const char* category, const std::string& track,
                   Clock::time_point begin, Clock::time_point end, std::string args = "");
  // An instant event ("ph":"i") now on the calling thread.
  void Instant(std::string name, const char* category);

  Status WriteJson(const std::string& path) const;

 private:
  struct Event {
    std::string name;
    const char* category;
    char phase;
    double ts_us;
    double dur_us;
    uint64_t tid;
    std::string args;  // a JSON object's text, or empty
  };
  uint64_t ThreadId();                        // REQUIRES: mu_ held
  uint64_t TrackId(const std::string& track);  // REQUIRES: mu_ held

  const bool enabled_;
  const Clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // guarded by mu_
  std::vector<std::pair<std::thread::id, uint64_t>> threads_;  // guarded by mu_
  std::vector<std::pair<std::string, uint64_t>> tracks_;       // guarded by mu_
  uint64_t next_tid_ = 1;                                      // guarded by mu_
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_TRACE_H_
