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
  // A complete event from `begin` to `end` on a track of the group `group` ("read 0",
  // "read 1", ...): the first whose last event ended by `begin`, so that work that overlaps
  // (reads in flight) lies on as many tracks as it needs and every track nests. Thread-safe.
  void SpanInLane(std::string name, const char* category, const std::string& group,
                  Clock::time_point begin, Clock::time_point end, std::string args = "");
  // An instant event ("ph":"i") now on the calling thread.
  void Instant(std::string name, const char* category);
  // Names the calling thread's track (else: "worker N" in the order threads are first seen).
  void NameThread(std::string name);

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
  struct Track {
    std::string name;
    uint64_t tid;
  };
  struct Lane {
    std::string group;
    double end_us;  // of its last event
    uint64_t tid;
  };
  uint64_t ThreadId();                        // REQUIRES: mu_ held
  uint64_t TrackId(const std::string& track);  // REQUIRES: mu_ held
  double Micros(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - start_).count();
  }

  const bool enabled_;
  const Clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // guarded by mu_
  std::vector<std::pair<std::thread::id, uint64_t>> threads_;  // guarded by mu_
  std::vector<Track> tracks_;  // every tid with its name; guarded by mu_
  std::vector<Lane> lanes_;    // guarded by mu_
  uint64_t next_tid_ = 1;      // guarded by mu_
  int workers_seen_ = 0;       // guarded by mu_
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_TRACE_H_
