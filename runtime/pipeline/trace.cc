#include "runtime/pipeline/trace.h"

#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/out_file.h"

namespace loadstone::pipeline {

uint64_t TraceRecorder::ThreadId() {  // REQUIRES: mu_ held
  const auto self = std::this_thread::get_id();
  for (const auto& [id, n] : threads_) {
    if (id == self) return n;
  }
  threads_.emplace_back(self, next_tid_);
  tracks_.push_back({fmt::format("worker {}", ++workers_seen_), next_tid_});
  return next_tid_++;
}

uint64_t TraceRecorder::TrackId(const std::string& track) {  // REQUIRES: mu_ held
  for (const Track& t : tracks_) {
    if (t.name == track) return t.tid;
  }
  tracks_.push_back({track, next_tid_});
  return next_tid_++;
}

void TraceRecorder::NameThread(std::string name) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  const uint64_t tid = ThreadId();
  for (Track& t : tracks_) {
    if (t.tid == tid) {
      if (t.name.starts_with("worker ")) --workers_seen_;
      t.name = std::move(name);
    }
  }
}

void TraceRecorder::SpanInLane(std::string name, const char* category, const std::string& group,
                               Clock::time_point begin, Clock::time_point end, std::string args) {
  if (!enabled_) return;
  const double begin_us = Micros(begin), end_us = Micros(end);
  std::lock_guard lock(mu_);
  Lane* lane = nullptr;
  size_t in_group = 0;
  for (Lane& l : lanes_) {
    if (l.group != group) continue;
    ++in_group;
    if (!lane && l.end_us <= begin_us) lane = &l;
  }
  if (!lane) {
    const uint64_t tid = TrackId(fmt::format("{} {}", group, in_group));
    lanes_.push_back({group, 0, tid});
    lane = &lanes_.back();
  }
  lane->end_us = end_us;
  events_.push_back({std::move(name), category, 'X', begin_us, end_us - begin_us, lane->tid,
                     std::move(args)});
}

void TraceRecorder::Span(std::string name, const char* category, Clock::time_point begin,
                         std::string args) {
  if (!enabled_) return;
  const Clock::time_point end = Clock::now();
  std::lock_guard lock(mu_);
  events_.push_back({std::move(name), category, 'X',
                     std::chrono::duration<double, std::micro>(begin - start_).count(),
                     std::chrono::duration<double, std::micro>(end - begin).count(), ThreadId(),
                     std::move(args)});
}

void TraceRecorder::SpanOnTrack(std::string name, const char* category, const std::string& track,
                                Clock::time_point begin, Clock::time_point end, std::string args) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  events_.push_back({std::move(name), category, 'X',
                     std::chrono::duration<double, std::micro>(begin - start_).count(),
                     std::chrono::duration<double, std::micro>(end - begin).count(),
                     TrackId(track), std::move(args)});
}

void TraceRecorder::Instant(std::string name, const char* category) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mu_);
  events_.push_back({std::move(name), category, 'i',
                     std::chrono::duration<double, std::micro>(now - start_).count(), 0,
                     ThreadId(), ""});
}

Status TraceRecorder::WriteJson(const std::string& path) const {
  if (!enabled_) return Status::InvalidArgument("this load was not traced (LoadOptions::trace)");
  io::OutFile out;  // whole or not at all: a full disk leaves no truncated trace
  LOADSTONE_RETURN_IF_ERROR(out.OpenReplacing(path));
  std::string text = "{\"traceEvents\":[\n";
  auto flush = [&](bool always) -> Status {
    if (!always && text.size() < (1u << 20)) return Status::OK();
    Status s = out.Write(text);
    text.clear();
    return s;
  };
  std::lock_guard lock(mu_);
  text += R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"loadstone"}},)";
  text += "\n";
  for (const Track& track : tracks_) {  // every track is named: threads, streams, lanes
    fmt::format_to(std::back_inserter(text),
                   R"({{"name":"thread_name","ph":"M","pid":1,"tid":{},"args":{{"name":{}}}}},)"
                   "\n",
                   track.tid, nlohmann::json(track.name).dump());
  }
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    fmt::format_to(std::back_inserter(text),
                   R"({{"name":{},"cat":"{}","ph":"{}","ts":{:.3f},"pid":1,"tid":{})",
                   nlohmann::json(e.name).dump(), e.category, e.phase, e.ts_us, e.tid);
    if (e.phase == 'X') fmt::format_to(std::back_inserter(text), R"(,"dur":{:.3f})", e.dur_us);
    if (e.phase == 'i') text += R"(,"s":"t")";
    if (!e.args.empty()) text += ",\"args\":" + e.args;
    text += i + 1 < events_.size() ? "},\n" : "}\n";
    LOADSTONE_RETURN_IF_ERROR(flush(false));
  }
  text += "],\"displayTimeUnit\":\"ms\"}\n";
  LOADSTONE_RETURN_IF_ERROR(flush(true));
  return out.Commit();
}

}  // namespace loadstone::pipeline
