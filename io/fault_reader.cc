#include "io/fault_reader.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/event_fd.h"
#include "io/posix_error.h"
#include "io/read_state.h"

namespace loadstone::io {
namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  Clock::time_point due;
  ReadCompletion completion;
};

struct Forwarded {
  uint64_t tag;  // the caller's
  Status fault;  // replaces the wrapped reader's status when not OK
};

}  // namespace

struct FaultInjectingReader::State {
  Status FaultFor(const ReadRequest& r) const;
  void Pump(Reader* inner);
  void Release(Reader* inner, std::vector<Held>* held);

  std::vector<std::string> paths;
  FaultOptions options;
  std::unique_ptr<CompletionQueue> completions;
  EventFd stop;  // the destructor → the pump thread
  std::atomic<uint64_t> injected{0};
  std::mt19937_64 rng;  // pump thread only

  std::mutex mu;
  std::unordered_map<uint64_t, Forwarded> forwarded;  // by the id given to the inner reader
  uint64_t next_id = 0;                               // guarded by mu
  std::thread pump;
};

Result<std::unique_ptr<FaultInjectingReader>> FaultInjectingReader::Create(
    std::unique_ptr<Reader> inner, std::vector<std::string> paths, FaultOptions options) {
  auto state = std::make_unique<State>();
  LOADSTONE_ASSIGN_OR_RETURN(state->completions, CompletionQueue::Create());
  LOADSTONE_ASSIGN_OR_RETURN(state->stop, EventFd::Create());
  state->paths = std::move(paths);
  state->rng.seed(options.seed);
  state->options = std::move(options);
  State* raw = state.get();
  Reader* inner_raw = inner.get();
  std::unique_ptr<FaultInjectingReader> reader(
      new FaultInjectingReader(std::move(inner), std::move(state)));
  raw->pump = std::thread([raw, inner_raw] { raw->Pump(inner_raw); });
  return reader;
}

FaultInjectingReader::FaultInjectingReader(std::unique_ptr<Reader> inner,
                                           std::unique_ptr<State> state)
    : ReaderWrapper(std::move(inner)), state_(std::move(state)) {}

FaultInjectingReader::~FaultInjectingReader() {
  if (state_->pump.joinable()) {
    state_->stop.Signal();
    state_->pump.join();
  }
  // The wrapped reader is destroyed next (by ReaderWrapper): it cancels and waits.
}

std::string FaultInjectingReader::Describe() const {
  return fmt::format("fault-injecting wrapper over {}", inner()->Describe());
}

Status FaultInjectingReader::State::FaultFor(const ReadRequest& r) const {
  const std::string path = r.file < paths.size() ? paths[r.file] : "?";
  for (const FaultOptions::FileByte& f : options.eio_at) {
    if (f.file == r.file && f.byte >= r.offset && f.byte - r.offset < r.length) {
      return ErrnoStatus(EIO,
                         fmt::format("read {} bytes at offset {} (bad byte at offset {}) of",
                                     r.length, r.offset, f.byte),
                         path);
    }
  }
  for (const FaultOptions::FileByte& f : options.truncate_at) {
    if (f.file == r.file && r.length > 0 && r.offset + r.length > f.byte) {
      return TruncatedError(path, r, f.byte);
    }
  }
  return Status::OK();
}

void FaultInjectingReader::Submit(std::span<const ReadRequest> requests) {
  State& s = *state_;
  s.completions->AddOutstanding(requests.size());
  std::vector<ReadRequest> forward(requests.begin(), requests.end());
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (ReadRequest& r : forward) {
      const uint64_t id = s.next_id++;
      s.forwarded.emplace(id, Forwarded{r.tag, s.FaultFor(r)});
      r.tag = id;
    }
  }
  inner()->Submit(forward);
}

void FaultInjectingReader::State::Pump(Reader* inner) {
  std::vector<Held> held;
  std::vector<ReadCompletion> batch;
  for (;;) {
    int timeout_ms = -1;
    if (!held.empty()) {
      auto first = std::min_element(held.begin(), held.end(),
                                    [](const Held& a, const Held& b) { return a.due < b.due; });
      auto wait = std::chrono::ceil<std::chrono::milliseconds>(first->due - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, wait.count()));
      // Held back for reordering but not yet due to a timer: look again soon.
      if (timeout_ms == 0 && options.reorder_window > 1) timeout_ms = 1;
    }
    pollfd fds[2] = {{inner->completion_fd(), POLLIN, 0}, {stop.fd(), POLLIN, 0}};
    int n = ::poll(fds, 2, timeout_ms);
    if (n < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    batch.clear();
    inner->Reap(&batch);
    const Clock::time_point due = Clock::now() + options.latency;
    for (ReadCompletion& c : batch) {
      Forwarded f;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = forwarded.find(c.tag);
        f = std::move(it->second);
        forwarded.erase(it);
      }
      Status status = std::move(c.status);
      if (!f.fault.ok()) {
        injected.fetch_add(1, std::memory_order_relaxed);
        status = std::move(f.fault);
      }
      held.push_back(Held{due, ReadCompletion{f.tag, std::move(status)}});
    }
    Release(inner, &held);
  }
}

void FaultInjectingReader::State::Release(Reader* inner, std::vector<Held>* held) {
  const Clock::time_point now = Clock::now();
  auto not_due = std::stable_partition(held->begin(), held->end(),
                                       [&](const Held& h) { return h.due <= now; });
  const size_t due = static_cast<size_t>(not_due - held->begin());
  if (due == 0) return;
  if (options.reorder_window > 1) {
    // Wait for a full window, unless nothing more can come.
    if (due < options.reorder_window && inner->pending() > 0) return;
    std::shuffle(held->begin(), not_due, rng);
  }
  std::vector<ReadCompletion> out;
  out.reserve(due);
  for (auto it = held->begin(); it != not_due; ++it) out.push_back(std::move(it->completion));
  held->erase(held->begin(), not_due);
  completions->Push(&out);
}

size_t FaultInjectingReader::Reap(std::vector<ReadCompletion>* out) {
  return state_->completions->Reap(out);
}

int FaultInjectingReader::completion_fd() const { return state_->completions->fd(); }

size_t FaultInjectingReader::pending() const { return state_->completions->outstanding(); }

uint64_t FaultInjectingReader::injected() const {
  return state_->injected.load(std::memory_order_relaxed);
}

}  // namespace loadstone::io
