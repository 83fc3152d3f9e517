// HttpReader (http_reader.h): the probe of each URL, the ranges cut from the requests, and the
// thread that keeps up to `connections` of them on libcurl's multi handle, checks each answer
// against the probe, retries the transient faults and posts what finished.
#include "io/http_reader.h"

#include <curl/curl.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/http_wire.h"
#include "io/hub_cache.h"
#include "io/location.h"
#include "io/read_state.h"

namespace loadstone::io {

struct HttpReader::Impl {
  void Run();
  void Start(std::unique_ptr<HttpRange> range);
  void Finish(HttpRange* raw, CURLcode code);
  void Retire(std::unique_ptr<HttpRange> range);
  void CancelAll();

  HttpReaderOptions options;
  std::vector<HttpObject> objects;
  std::vector<RequestAuth> auth;  // per object: how its ranges are asked
  std::unique_ptr<CompletionQueue> completions;
  std::shared_ptr<HubCache> cache;  // null without options.hub_cache
  StatCounters stats;
  CURLM* multi = nullptr;

  std::mutex mu;
  std::vector<std::shared_ptr<PendingRead>> inbox;  // guarded by mu
  bool cancelled = false;                           // guarded by mu
  bool stopping = false;                            // guarded by mu

  // The thread's own.
  std::deque<std::shared_ptr<PendingRead>> queue;  // not fully cut, in order
  std::deque<std::unique_ptr<HttpRange>> waiting;  // to retry, each after its not_before
  std::vector<std::unique_ptr<HttpRange>> active;  // on the multi handle
  std::vector<CURL*> idle;                          // easy handles to reuse
  std::vector<ReadCompletion> done;
  std::thread thread;
};

namespace {

Status CheckHttpOptions(const HttpReaderOptions& options) {
  if (options.connections < 1 || options.connections > 256) {
    return Status::InvalidArgument(
        fmt::format("connections {} is out of range (1..256)", options.connections));
  }
  if (options.range_bytes < (64 << 10) || options.range_bytes > (1ULL << 30)) {
    return Status::InvalidArgument(
        fmt::format("range_bytes {} is out of range (64 KiB..1 GiB)", options.range_bytes));
  }
  if (options.attempts < 1 || options.attempts > 100) {
    return Status::InvalidArgument(
        fmt::format("attempts {} is out of range (1..100)", options.attempts));
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<HttpReader>> HttpReader::Open(const std::vector<std::string>& urls,
                                                     const HttpReaderOptions& options) {
  LOADSTONE_RETURN_IF_ERROR(CheckHttpOptions(options));
  LOADSTONE_RETURN_IF_ERROR(InitCurl());
  auto impl = std::make_unique<Impl>();
  for (Result<HttpObject>& probed : ProbeHttp(urls, options)) {
    if (!probed.ok()) return probed.status();
    LOADSTONE_ASSIGN_OR_RETURN(RequestAuth auth, AuthFor(probed->url, probed->effective_url));
    impl->auth.push_back(std::move(auth));
    impl->objects.push_back(std::move(probed).value());
  }
  impl->options = options;
  if (options.hub_cache) {
    LOADSTONE_ASSIGN_OR_RETURN(impl->cache, HubCache::Create(*options.hub_cache, impl->objects));
  }
  LOADSTONE_ASSIGN_OR_RETURN(impl->completions, CompletionQueue::Create());
  impl->multi = curl_multi_init();
  if (impl->multi == nullptr) return Status::OutOfMemory("libcurl could not make a multi handle");
  curl_multi_setopt(impl->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                    static_cast<long>(options.connections));
  curl_multi_setopt(impl->multi, CURLMOPT_MAXCONNECTS, static_cast<long>(options.connections));
  Impl* raw = impl.get();
  std::unique_ptr<HttpReader> reader(new HttpReader(std::move(impl)));
  raw->thread = std::thread([raw] { raw->Run(); });
  return reader;
}

HttpReader::HttpReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpReader::~HttpReader() {
  Cancel();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  if (impl_->thread.joinable()) {
    curl_multi_wakeup(impl_->multi);
    impl_->thread.join();
  }
  for (CURL* easy : impl_->idle) curl_easy_cleanup(easy);
  if (impl_->multi) curl_multi_cleanup(impl_->multi);
}

const std::vector<HttpObject>& HttpReader::objects() const { return impl_->objects; }

std::string HttpReader::Describe() const {
  const curl_version_info_data* v = curl_version_info(CURLVERSION_NOW);
  // The objects' protocol (the first's: one load's objects are on one server as a rule).
  const std::string protocol = impl_->objects.empty() ? "" : impl_->objects[0].protocol + ", ";
  return fmt::format("http (libcurl {}, {}{} connections, {} MiB ranges)", v->version, protocol,
                     impl_->options.connections, impl_->options.range_bytes >> 20);
}

void HttpReader::Submit(std::span<const ReadRequest> requests) {
  Impl& d = *impl_;
  std::vector<std::shared_ptr<PendingRead>> accepted =
      Admit(requests, d.objects.size(), *d.completions, d.stats);
  if (accepted.empty()) return;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (std::shared_ptr<PendingRead>& read : accepted) {
      if (d.cancelled) {
        d.completions->Push(read->request.tag,
                            CancelledError(d.objects[read->request.file].url, read->request));
      } else {
        d.inbox.push_back(std::move(read));
      }
    }
  }
  curl_multi_wakeup(d.multi);
}

size_t HttpReader::Reap(std::vector<ReadCompletion>* out) { return impl_->completions->Reap(out); }
int HttpReader::completion_fd() const { return impl_->completions->fd(); }
size_t HttpReader::pending() const { return impl_->completions->outstanding(); }
ReaderStats HttpReader::stats() const { return impl_->stats.Snapshot(); }

void HttpReader::Cancel() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancelled = true;
  }
  curl_multi_wakeup(impl_->multi);
  if (impl_->cache) impl_->cache->Cancel();  // Finish(), if it runs, stops too
}

std::string HttpReader::Finish() { return impl_->cache ? impl_->cache->Finish() : std::string(); }

Result<uint64_t> HttpReader::SizeNow(uint32_t file) const {
  if (file >= impl_->objects.size()) return Status::InvalidArgument("no such file in the reader");
  return impl_->objects[file].size;
}

void HttpReader::Impl::Run() {
  for (;;) {
    bool cancel, stop;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& read : inbox) queue.push_back(std::move(read));
      inbox.clear();
      cancel = cancelled;
      stop = stopping;
    }
    if (cancel) CancelAll();
    // Ranges out while there is room: retries that are due first, then new ones in order.
    const auto now = Clock::now();
    while (active.size() < static_cast<size_t>(options.connections)) {
      auto due = std::find_if(waiting.begin(), waiting.end(),
                              [&](const auto& r) { return r->not_before <= now; });
      if (due != waiting.end()) {
        std::unique_ptr<HttpRange> range = std::move(*due);
        waiting.erase(due);
        Start(std::move(range));
        continue;
      }
      while (!queue.empty() && queue.front()->fully_scheduled()) queue.pop_front();
      if (queue.empty()) break;
      std::shared_ptr<PendingRead> read = queue.front();
      auto range = std::make_unique<HttpRange>();
      range->read = read;
      range->start = read->scheduled;
      range->length = std::min(read->remaining(), options.range_bytes);
      read->scheduled += range->length;
      ++read->in_flight;
      Start(std::move(range));
    }
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      HttpRange* range = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &range);
      Finish(range, msg->data.result);
    }
    completions->Push(&done);
    if (stop && active.empty() && waiting.empty() && queue.empty()) break;
    // Ranges that finished left room for more: start them before waiting on the sockets.
    while (!queue.empty() && queue.front()->fully_scheduled()) queue.pop_front();
    if (active.size() < static_cast<size_t>(options.connections) && !queue.empty()) continue;
    int timeout_ms = 1000;
    for (const auto& r : waiting) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(r->not_before - now);
      timeout_ms = std::clamp(static_cast<int>(wait.count()), 0, timeout_ms);
    }
    curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
  }
}

void HttpReader::Impl::Start(std::unique_ptr<HttpRange> range) {
  if (range->read->stopped()) return Retire(std::move(range));
  CURL* easy = nullptr;
  if (!idle.empty()) {
    easy = idle.back();
    idle.pop_back();
    curl_easy_reset(easy);
  } else {
    easy = curl_easy_init();
  }
  if (easy == nullptr) {
    range->read->Fail(Status::OutOfMemory("libcurl could not make a handle"));
    return Retire(std::move(range));
  }
  const ReadRequest& r = range->read->request;
  const HttpObject& object = objects[r.file];
  const uint64_t first = r.offset + range->start + range->got;
  const uint64_t last = r.offset + range->start + range->length - 1;
  const std::string span = fmt::format("{}-{}", first, last);
  range->easy = easy;
  range->answer = Answer();
  range->checked = false;
  range->error[0] = '\0';
  CommonOptions(easy, options);
  // The address the probe ended at: a redirect is followed once, not per range (the Hub's
  // CDN address is the one to ask).
  curl_easy_setopt(easy, CURLOPT_URL, object.effective_url.c_str());
  curl_easy_setopt(easy, CURLOPT_RANGE, span.c_str());  // copied by libcurl
  auth[r.file].Apply(easy);
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &range->answer);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, range.get());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, range->error);
  curl_easy_setopt(easy, CURLOPT_BUFFERSIZE, 512L << 10);  // fewer, larger reads of the socket
  curl_easy_setopt(easy, CURLOPT_PRIVATE, range.get());
  range->object = &object;
  range->stats = &stats;
  if (curl_multi_add_handle(multi, easy) != CURLM_OK) {
    curl_easy_cleanup(easy);
    range->easy = nullptr;
    range->read->Fail(Status::OutOfMemory("libcurl could not take another transfer"));
    return Retire(std::move(range));
  }
  active.push_back(std::move(range));
}

void HttpReader::Impl::Finish(HttpRange* raw, CURLcode code) {
  auto it = std::find_if(active.begin(), active.end(), [&](const auto& r) { return r.get() == raw; });
  if (it == active.end()) return;
  std::unique_ptr<HttpRange> range = std::move(*it);
  active.erase(it);
  curl_multi_remove_handle(multi, range->easy);
  long status = 0;
  curl_easy_getinfo(range->easy, CURLINFO_RESPONSE_CODE, &status);
  // A handle whose transfer failed may hold a broken connection's state: not reused.
  if (code == CURLE_OK) {
    idle.push_back(range->easy);
  } else {
    curl_easy_cleanup(range->easy);
  }
  range->easy = nullptr;
  bool retry = false;
  Status outcome = RangeOutcome(*range, code, status, &retry);
  if (!retry || ++range->attempt >= options.attempts) {
    if (retry) {
      const ReadRequest& r = range->read->request;
      outcome = Exhausted(fmt::format("reading bytes {}-{}", r.offset + range->start + range->got,
                                      r.offset + range->start + range->length - 1),
                          range->object->url, range->attempt, outcome);
    }
    if (!outcome.ok()) range->read->Fail(std::move(outcome));
    return Retire(std::move(range));
  }
  Add(stats.resubmits, 1);
  range->not_before = Clock::now() + RetryDelay(range->attempt, range->answer.retry_after_ms, options);
  waiting.push_back(std::move(range));
}

void HttpReader::Impl::Retire(std::unique_ptr<HttpRange> range) {
  if (range->easy != nullptr) {  // still on the multi handle (a cancel)
    curl_multi_remove_handle(multi, range->easy);
    curl_easy_cleanup(range->easy);
  }
  PendingRead& read = *range->read;
  --read.in_flight;
  if (read.TakeCompletion()) {
    if (read.status.ok()) Add(stats.bytes, read.request.length);
    if (read.status.ok() && cache) {  // before the completion hands `dst` back
      const ReadRequest& r = read.request;
      cache->Wrote(r.file, r.offset, std::span<const std::byte>(r.dst, r.length));
    }
    done.push_back({read.request.tag, read.status});
  }
}

void HttpReader::Impl::CancelAll() {
  for (const auto& read : queue) {
    read->Fail(CancelledError(objects[read->request.file].url, read->request));
    if (read->TakeCompletion()) done.push_back({read->request.tag, read->status});
  }
  queue.clear();
  auto cancel = [&](std::unique_ptr<HttpRange> range) {
    range->read->Fail(CancelledError(objects[range->read->request.file].url, range->read->request));
    Retire(std::move(range));
  };
  for (auto& range : waiting) cancel(std::move(range));
  waiting.clear();
  std::vector<std::unique_ptr<HttpRange>> out = std::move(active);
  active.clear();
  for (auto& range : out) cancel(std::move(range));
}

bool AccessRefused(const Status& status) {
  return status.code() == StatusCode::kIOError &&
         status.message().find("' answered HTTP 403 to ") != std::string::npos;
}

bool AbsentObject(const std::string& url, const Status& status) {
  return status.code() == StatusCode::kNotFound || (IsS3Address(url) && AccessRefused(status));
}

bool IsRemoteAddress(std::string_view path) {
  return StartsWithNoCase(path, "http://") || StartsWithNoCase(path, "https://") ||
         IsS3Address(path);
}

Result<std::shared_ptr<RemoteObject>> RemoteObject::Open(const std::string& url) {
  LOADSTONE_ASSIGN_OR_RETURN(auto reader, HttpReader::Open({url}, HttpReaderOptions()));
  auto object = std::shared_ptr<RemoteObject>(new RemoteObject(reader->objects()[0]));
  object->reader_ = std::move(reader);
  return object;
}

Status RemoteObject::Read(uint64_t offset, std::span<std::byte> dst) {
  std::lock_guard<std::mutex> lock(mu_);
  const ReadRequest request{0, offset, dst.size(), dst.data(), 0};
  reader_->Submit({&request, 1});
  std::vector<ReadCompletion> done;
  // The reader's own limits (connect and stall timeouts, attempts) bound the wait.
  while (done.empty()) {
    pollfd pfd{reader_->completion_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 1000);
    reader_->Reap(&done);
  }
  return done.front().status;
}

}  // namespace loadstone::io
