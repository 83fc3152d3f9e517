// HttpReader (http_reader.h): the probe of each URL, the ranges cut from the requests, and the
// thread that keeps up to `connections` of them on libcurl's multi handle, checks each answer
// against the probe, retries the transient faults and posts what finished.
#include "io/http_reader.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/read_state.h"

namespace loadstone::io {
namespace {

using Clock = std::chrono::steady_clock;

Status InitCurl() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    return Status::IOError(fmt::format("libcurl could not start: {}", curl_easy_strerror(code)));
  }
  return Status::OK();
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    const char a = s[i] >= 'A' && s[i] <= 'Z' ? static_cast<char>(s[i] - 'A' + 'a') : s[i];
    if (a != prefix[i]) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) {
    s.remove_suffix(1);
  }
  return s;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

// The headers of the last response of a transfer (a redirect's are dropped when the next
// status line comes).
struct Answer {
  long status = 0;
  bool has_range = false;  // Content-Range: bytes FIRST-LAST/TOTAL (or */TOTAL)
  uint64_t first = 0, last = 0, total = 0;
  bool unsatisfied = false;  // */TOTAL
  std::string etag, last_modified;
  int64_t retry_after_ms = -1;
  int64_t content_length = -1;

  void Line(std::string_view line) {
    if (StartsWithNoCase(line, "http/")) {
      *this = Answer();
      const size_t sp = line.find(' ');
      uint64_t code = 0;
      if (sp != std::string_view::npos && ParseU64(line.substr(sp + 1, 3), &code)) {
        status = static_cast<long>(code);
      }
      return;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = Trim(line.substr(colon + 1));
    auto is = [&](std::string_view n) { return name.size() == n.size() && StartsWithNoCase(name, n); };
    if (is("etag")) {
      etag = value;
    } else if (is("last-modified")) {
      last_modified = value;
    } else if (is("content-length")) {
      uint64_t n = 0;
      if (ParseU64(value, &n)) content_length = static_cast<int64_t>(n);
    } else if (is("retry-after")) {
      uint64_t seconds = 0;
      if (ParseU64(value, &seconds)) retry_after_ms = static_cast<int64_t>(std::min<uint64_t>(seconds, 86400) * 1000);
    } else if (is("content-range")) {
      std::string_view v = value;
      if (!StartsWithNoCase(v, "bytes ")) return;
      v.remove_prefix(6);
      const size_t slash = v.find('/');
      if (slash == std::string_view::npos || !ParseU64(v.substr(slash + 1), &total)) return;
      const std::string_view span = v.substr(0, slash);
      if (span == "*") {
        unsatisfied = has_range = true;
        return;
      }
      const size_t dash = span.find('-');
      if (dash == std::string_view::npos) return;
      has_range = ParseU64(span.substr(0, dash), &first) && ParseU64(span.substr(dash + 1), &last);
    }
  }
};

size_t OnHeader(char* buffer, size_t size, size_t n, void* user) {
  static_cast<Answer*>(user)->Line(std::string_view(buffer, size * n));
  return size * n;
}

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

// The options every handle gets: http(s) only, redirects followed (at most 10), no signals,
// the connect and stall limits.
void CommonOptions(CURL* easy, const HttpReaderOptions& o) {
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(easy, CURLOPT_USERAGENT, "loadstone");
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_ms));
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(1, (o.stall_timeout_ms + 999) / 1000)));
}

bool Transient(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

bool TransientCurl(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// The error for an HTTP status the server answered with, naming the URL and bytes.
Status HttpError(long status, const std::string& url, std::string_view what) {
  if (status == 404 || status == 410) {
    return Status::NotFound(fmt::format(
        "'{}' answered HTTP {} to {}: no such object; check the address (and the revision)", url,
        status, what));
  }
  if (status == 401 || status == 403) {
    return Status::IOError(fmt::format(
        "'{}' answered HTTP {} to {}: access refused; check the token or credentials", url,
        status, what));
  }
  return Status::IOError(fmt::format("'{}' answered HTTP {} to {}", url, status, what));
}

Status Probe(CURL* easy, HttpObject* object, const HttpReaderOptions& options) {
  Answer answer;
  char error[CURL_ERROR_SIZE] = {};
  CommonOptions(easy, options);
  curl_easy_setopt(easy, CURLOPT_URL, object->url.c_str());
  curl_easy_setopt(easy, CURLOPT_RANGE, "0-0");
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &answer);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, Discard);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 0L);  // a 416 (an empty object) is an answer
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(options.connect_timeout_ms + options.stall_timeout_ms));
  const CURLcode code = curl_easy_perform(easy);
  if (code != CURLE_OK) {
    return Status::IOError(fmt::format("cannot reach '{}': {}", object->url,
                                       error[0] ? error : curl_easy_strerror(code)));
  }
  char* effective = nullptr;
  curl_easy_getinfo(easy, CURLINFO_EFFECTIVE_URL, &effective);
  object->effective_url = effective ? effective : object->url;
  object->etag = answer.etag;
  object->last_modified = answer.last_modified;
  if (answer.status == 206 && answer.has_range && !answer.unsatisfied && answer.first == 0) {
    object->size = answer.total;
    return Status::OK();
  }
  // An empty object has no byte 0: 416 with bytes */0, or (nginx) a 200 with no body.
  if ((answer.status == 416 && answer.has_range && answer.unsatisfied && answer.total == 0) ||
      (answer.status == 200 && answer.content_length == 0)) {
    object->size = 0;
    return Status::OK();
  }
  if (answer.status == 200) {
    return Status::IOError(fmt::format(
        "'{}' does not serve byte ranges (it answered 200 to a Range request): loadstone reads "
        "ranges and will not download the whole object to memory; serve it with range support",
        object->url));
  }
  if (answer.status >= 400) return HttpError(answer.status, object->url, "a request for byte 0");
  return Status::IOError(fmt::format(
      "'{}' answered HTTP {} to a request for byte 0{}: expected 206 with a Content-Range",
      object->url, answer.status, answer.has_range ? "" : " without a Content-Range"));
}

// One range of a request on the wire: [start + got, start + length) of the request.
struct HttpRange {
  std::shared_ptr<PendingRead> read;
  uint64_t start = 0;   // within the request
  uint64_t length = 0;  // bytes of the request this range delivers
  uint64_t got = 0;     // written so far (kept across retries)
  int attempt = 0;
  Clock::time_point not_before{};
  CURL* easy = nullptr;
  Answer answer;
  bool checked = false;  // the answer was checked against the probe (first body byte)
  Status refused;        // set by the write callback when it aborts the transfer
  char error[CURL_ERROR_SIZE] = {};
  const HttpObject* object = nullptr;  // what the probe saw of its URL
};

// The answer of a range, at its first body byte: 206, the bytes asked for, the object as the
// probe saw it.
Status CheckAnswer(const HttpRange& range) {
  const ReadRequest& r = range.read->request;
  const HttpObject& object = *range.object;
  const Answer& a = range.answer;
  const uint64_t first = r.offset + range.start + range.got;
  const uint64_t last = r.offset + range.start + range.length - 1;
  if (a.status == 200) {
    return Status::IOError(fmt::format(
        "'{}' answered 200 (the whole object) to a request for bytes {}-{}: it no longer serves "
        "ranges; serve it with range support",
        object.url, first, last));
  }
  if (a.status != 206 || !a.has_range || a.unsatisfied || a.first != first || a.last != last) {
    return Status::Corruption(fmt::format(
        "'{}' answered HTTP {} with {} to a request for bytes {}-{}", object.url, a.status,
        a.has_range ? fmt::format("bytes {}-{}/{}", a.first, a.last, a.total)
                    : std::string("no Content-Range"),
        first, last));
  }
  const bool etag_changed = !object.etag.empty() && a.etag != object.etag;
  const bool date_changed = object.etag.empty() && !object.last_modified.empty() &&
                            a.last_modified != object.last_modified;
  if (a.total != object.size || etag_changed || date_changed) {
    return Status::Corruption(fmt::format(
        "'{}' changed during the load ({}): bytes {}-{} would come from another version than "
        "the rest; load again once it no longer changes",
        object.url,
        a.total != object.size ? fmt::format("{} bytes, {} when opened", a.total, object.size)
        : etag_changed         ? fmt::format("ETag {}, {} when opened", a.etag, object.etag)
                               : fmt::format("Last-Modified {}, {} when opened",
                                             a.last_modified, object.last_modified),
        first, last));
  }
  return Status::OK();
}

// libcurl's write callback of a range: checks the answer at its first byte, then writes the
// bytes into the request's memory; anything else aborts the transfer (CURLE_WRITE_ERROR) with
// the reason in `refused`.
size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto& range = *static_cast<HttpRange*>(user);
  const size_t bytes = size * n;
  if (!range.checked) {
    range.refused = CheckAnswer(range);
    range.checked = true;
  }
  if (range.refused.ok() && range.got + bytes > range.length) {
    range.refused = Status::Corruption(fmt::format(
        "'{}' sent more than the {} bytes asked for at offset {}", range.object->url,
        range.length, range.read->request.offset + range.start));
  }
  if (!range.refused.ok()) return 0;
  std::memcpy(range.read->request.dst + range.start + range.got, data, bytes);
  range.got += bytes;
  return bytes;
}

}  // namespace

struct HttpReader::Impl {
  void Run();
  void Start(std::unique_ptr<HttpRange> range);
  void Finish(HttpRange* raw, CURLcode code);
  void Retire(std::unique_ptr<HttpRange> range);
  void CancelAll();

  HttpReaderOptions options;
  std::vector<HttpObject> objects;
  std::unique_ptr<CompletionQueue> completions;
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

Result<std::unique_ptr<HttpReader>> HttpReader::Open(const std::vector<std::string>& urls,
                                                     const HttpReaderOptions& options) {
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
  LOADSTONE_RETURN_IF_ERROR(InitCurl());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  LOADSTONE_ASSIGN_OR_RETURN(impl->completions, CompletionQueue::Create());
  for (const std::string& url : urls) {
    if (!StartsWithNoCase(url, "http://") && !StartsWithNoCase(url, "https://")) {
      return Status::InvalidArgument(
          fmt::format("'{}' is not an http:// or https:// address", url));
    }
    CURL* easy = curl_easy_init();
    if (easy == nullptr) return Status::OutOfMemory("libcurl could not make a handle");
    HttpObject object;
    object.url = url;
    Status probed = Probe(easy, &object, options);
    curl_easy_cleanup(easy);
    LOADSTONE_RETURN_IF_ERROR(probed);
    impl->objects.push_back(std::move(object));
  }
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
  return fmt::format("http (libcurl {}, {} connections, {} MiB ranges)", v->version,
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
}

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
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &range->answer);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, range.get());
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, range->error);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, range.get());
  range->object = &object;
  curl_multi_add_handle(multi, easy);
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
  const ReadRequest& r = range->read->request;
  const std::string& url = objects[r.file].url;
  const uint64_t first = r.offset + range->start + range->got;
  const uint64_t last = r.offset + range->start + range->length - 1;
  if (!range->refused.ok()) {
    range->read->Fail(std::move(range->refused));
    return Retire(std::move(range));
  }
  if (code == CURLE_OK && range->got == range->length) return Retire(std::move(range));
  if (code == CURLE_OK && range->checked) {
    code = CURLE_PARTIAL_FILE;  // a body shorter than its range: continued from where it stopped
  } else if (code == CURLE_OK) {  // no body at all: whatever the server said, not the bytes
    range->read->Fail(Status::Corruption(fmt::format(
        "'{}' answered HTTP {} without a body to a request for bytes {}-{}", url, status, first,
        last)));
    return Retire(std::move(range));
  }
  const bool http_error = code == CURLE_HTTP_RETURNED_ERROR;
  const bool transient = http_error ? Transient(status) : TransientCurl(code);
  const std::string why = http_error ? fmt::format("HTTP {}", status)
                          : range->error[0] ? std::string(range->error)
                                            : std::string(curl_easy_strerror(code));
  if (http_error && status == 416) {
    range->read->Fail(Status::Corruption(fmt::format(
        "'{}' no longer has bytes {}-{} (HTTP 416): it changed during the load; load again once "
        "it no longer changes",
        url, first, last)));
    return Retire(std::move(range));
  }
  if (!transient) {
    range->read->Fail(http_error ? HttpError(status, url, fmt::format("bytes {}-{}", first, last))
                                 : Status::IOError(fmt::format("reading bytes {}-{} of '{}': {}",
                                                               first, last, url, why)));
    return Retire(std::move(range));
  }
  if (++range->attempt >= options.attempts) {
    range->read->Fail(Status::IOError(fmt::format(
        "reading bytes {}-{} of '{}' failed {} times, the last: {}; check the server and the "
        "network, then load again",
        first, last, url, range->attempt, why)));
    return Retire(std::move(range));
  }
  Add(stats.resubmits, 1);
  int64_t backoff = int64_t{100} << std::min(range->attempt, 10);
  if (range->answer.retry_after_ms >= 0) backoff = range->answer.retry_after_ms;
  backoff = std::min(backoff, options.max_backoff_ms);
  range->not_before = Clock::now() + std::chrono::milliseconds(backoff);
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

}  // namespace loadstone::io
