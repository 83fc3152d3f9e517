// HttpReader's wire (http_wire.h): libcurl set up once, the options of every transfer, the
// headers of an answer parsed, the probe, a range's checks and its bytes written into place.
#include "io/http_wire.h"

#include <algorithm>
#include <cstring>
#include <atomic>

#include <fmt/format.h>

#include "io/location.h"

namespace loadstone::io {
namespace {

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

}  // namespace

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

size_t OnHeader(char* buffer, size_t size, size_t n, void* user) {
  static_cast<Answer*>(user)->Line(std::string_view(buffer, size * n));
  return size * n;
}

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

void RequestAuth::Apply(CURL* easy) const {
  if (headers) curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers.get());
  if (!ca_bundle.empty()) curl_easy_setopt(easy, CURLOPT_CAINFO, ca_bundle.c_str());
  if (sigv4.empty()) return;
  // Signed requests follow no redirect: libcurl keeps custom headers (the session token) on a
  // redirect to another host, and S3 sends a wrong region's requests elsewhere with a 301.
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4.c_str());  // strings are copied by libcurl
  curl_easy_setopt(easy, CURLOPT_USERPWD, userpwd.c_str());
}

Result<RequestAuth> AuthFor(const std::string& url, const std::string& target) {
  RequestAuth auth;
  auth.address = target;
  auth.ca_bundle = CaBundle(IsS3Address(url));
  auto add = [&auth](const std::string& line) {
    auth.headers.reset(curl_slist_append(auth.headers.release(), line.c_str()));
  };
  if (IsS3Address(url)) {
    LOADSTONE_ASSIGN_OR_RETURN(const S3Address s3, ParseS3Address(url));
    LOADSTONE_ASSIGN_OR_RETURN(const S3Credentials credentials, FindS3Credentials());
    if (IsS3Address(target)) auth.address = s3.address;
    auth.sigv4 = fmt::format("aws:amz:{}:s3", s3.region);
    auth.userpwd = fmt::format("{}:{}", credentials.access_key, credentials.secret_key);
    // S3 wants the body's hash named; a GET has none (libcurl before 8.x does not add it).
    add("x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    if (!credentials.session_token.empty()) {
      add(fmt::format("x-amz-security-token: {}", credentials.session_token));
    }
  } else if (SendsHubToken(target)) {
    if (const std::string token = HubToken(); !token.empty()) {
      add(fmt::format("Authorization: Bearer {}", token));
    }
  }
  return auth;
}

std::chrono::milliseconds RetryDelay(int attempt, int64_t retry_after_ms,
                                     const HttpReaderOptions& options) {
  if (retry_after_ms >= 0) return std::chrono::milliseconds(std::min(retry_after_ms, options.max_backoff_ms));
  // Full jitter (a uniform wait up to the doubled bound), so that ranges cut off together do not
  // come back together.
  const int64_t bound = std::min(int64_t{100} << std::min(attempt, 10), options.max_backoff_ms);
  if (bound <= 1) return std::chrono::milliseconds(bound);
  // splitmix64 over one shared counter: no thread_local state (a dlopen'ed libloadstone, as
  // Python loads it, has little static TLS to spare: a thread_local mt19937_64 failed its import).
  static std::atomic<uint64_t> counter{static_cast<uint64_t>(Clock::now().time_since_epoch().count())};
  uint64_t z = counter.fetch_add(0x9E3779B97F4A7C15ULL, std::memory_order_relaxed);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  const int64_t half = bound / 2;
  return std::chrono::milliseconds(half + static_cast<int64_t>(z % static_cast<uint64_t>(bound - half + 1)));
}

Status Exhausted(std::string_view what, const std::string& url, int attempts, const Status& last) {
  return Status::IOError(fmt::format(
      "{} of '{}' failed {} times, the last: {}; check the server and the network, then try "
      "again",
      what, url, attempts, last.message()));
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
  Add(range.stats->network_bytes, bytes);
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

Status RangeOutcome(HttpRange& range, CURLcode code, long status, bool* retry) {
  *retry = false;
  if (!range.refused.ok()) return std::move(range.refused);
  if (code == CURLE_OK && range.got == range.length) return Status::OK();
  const ReadRequest& r = range.read->request;
  const std::string& url = range.object->url;
  const uint64_t first = r.offset + range.start + range.got;
  const uint64_t last = r.offset + range.start + range.length - 1;
  if (code == CURLE_OK && range.checked) {
    code = CURLE_PARTIAL_FILE;  // a body shorter than its range: continued from where it stopped
  } else if (code == CURLE_OK) {  // no body at all: whatever the server said, not the bytes
    return Status::Corruption(fmt::format(
        "'{}' answered HTTP {} without a body to a request for bytes {}-{}", url, status, first,
        last));
  }
  const bool http_error = code == CURLE_HTTP_RETURNED_ERROR;
  if (http_error && status == 416) {
    return Status::Corruption(fmt::format(
        "'{}' no longer has bytes {}-{} (HTTP 416): it changed during the load; load again once "
        "it no longer changes",
        url, first, last));
  }
  *retry = http_error ? Transient(status) : TransientCurl(code);
  if (http_error) {
    return *retry ? Status::IOError(fmt::format("HTTP {}", status))
                  : HttpError(status, url, fmt::format("bytes {}-{}", first, last));
  }
  const std::string why = range.error[0] ? std::string(range.error) : curl_easy_strerror(code);
  return *retry ? Status::IOError(why)
                : Status::IOError(fmt::format("reading bytes {}-{} of '{}': {}", first, last, url,
                                              why));
}

void Answer::Line(std::string_view line) {
  if (StartsWithNoCase(line, "http/")) {
    Answer next;
    next.linked_etag = std::move(linked_etag);
    next.repo_commit = std::move(repo_commit);
    *this = std::move(next);
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
  } else if (is("x-linked-etag")) {
    if (linked_etag.empty()) linked_etag = value;
  } else if (is("x-repo-commit")) {
    if (repo_commit.empty()) repo_commit = value;
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

}  // namespace loadstone::io
