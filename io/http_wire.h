// What goes over the wire for HttpReader (http_reader.h), private to loadstone_io: libcurl's
// set-up and the options and headers every transfer gets, the headers of an answer, and a
// range's checks of what the server sends against what the probe saw (the probes themselves:
// http_probe.cc).
#ifndef LOADSTONE_IO_HTTP_WIRE_H_
#define LOADSTONE_IO_HTTP_WIRE_H_

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "io/http_reader.h"
#include "io/read_state.h"
#include "loadstone/status.h"

namespace loadstone::io {

using Clock = std::chrono::steady_clock;

// curl_global_init, once per process. Errors: IOError.
Status InitCurl();
bool StartsWithNoCase(std::string_view s, std::string_view lowercase_prefix);

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
  uint64_t body_bytes = 0;  // the probe's: what came of the body
  // The Hub's X-Linked-Etag and X-Repo-Commit: kept from the first answer that has them (its
  // 302 to the CDN) when the next status line comes.
  std::string linked_etag, repo_commit;

  // One header line (or a status line, which starts a new answer).
  void Line(std::string_view line);
};

// libcurl's header callback; `user` is an Answer.
size_t OnHeader(char* buffer, size_t size, size_t n, void* user);

// The options every handle gets: http(s) only, redirects followed (at most 10), no signals,
// HTTP errors as errors, the connect and stall limits.
void CommonOptions(CURL* easy, const HttpReaderOptions& options);

struct FreeHeaderList {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using HeaderList = std::unique_ptr<curl_slist, FreeHeaderList>;

// How the requests for one object are asked and signed: where (an s3:// object's http(s)
// address), the Hub's token, S3's SigV4 (libcurl signs each request).
struct RequestAuth {
  std::string address;  // what the first request asks for
  HeaderList headers;   // CURLOPT_HTTPHEADER; must outlive the transfers
  std::string sigv4;    // CURLOPT_AWS_SIGV4 ("aws:amz:REGION:s3"); empty: not signed
  std::string userpwd;  // ACCESS_KEY:SECRET for the signature
  std::string ca_bundle;  // CURLOPT_CAINFO (io/location.h CaBundle); empty: the system's
  // Sets the headers, the signing and the certificate authorities on a handle.
  void Apply(CURL* easy) const;
};
// The auth of requests to `target` for the object the user named `url`: an s3:// object's are
// signed wherever they go; the Hub's token goes to the Hub's endpoint only (io/location.h).
// Errors: an s3:// address that does not parse or has no credentials (InvalidArgument).
Result<RequestAuth> AuthFor(const std::string& url, const std::string& target);

// Faults worth a retry: these HTTP statuses, these libcurl results.
bool Transient(long status);
bool TransientCurl(CURLcode code);
// The error for an HTTP status a server answered with, naming the URL and `what` was asked.
Status HttpError(long status, const std::string& url, std::string_view what);
// The wait before try number attempt + 1 of a transient fault: the server's Retry-After (-1:
// none), else between half of and 100 ms doubled per attempt (random: full jitter); at most
// max_backoff_ms.
std::chrono::milliseconds RetryDelay(int attempt, int64_t retry_after_ms,
                                     const HttpReaderOptions& options);
// The error once a transient fault outlasted the attempts: `what` ("bytes 0-99") of `url`
// failed `attempts` times, the last with `last`.
Status Exhausted(std::string_view what, const std::string& url, int attempts, const Status& last);

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
  StatCounters* stats = nullptr;       // the reader's: network_bytes counted as bodies arrive
};

// The answer of a range, at its first body byte: 206, the bytes asked for, the object as the
// probe saw it. Errors: Corruption (another range, another version), IOError (no ranges).
Status CheckAnswer(const HttpRange& range);
// libcurl's write callback of a range (`user`): checks the answer at its first byte, then
// writes the bytes into the request's memory; anything else aborts the transfer
// (CURLE_WRITE_ERROR) with the reason in `refused`.
size_t OnBody(char* data, size_t size, size_t n, void* user);

// What a range that ended with libcurl's `code` (and HTTP `status`) comes to: OK when all its
// bytes came; else the error, *retry when it is transient (a body cut short, a reset, a stall,
// 429/5xx: its message is then the reason, for the caller's last-attempt error).
Status RangeOutcome(HttpRange& range, CURLcode code, long status, bool* retry);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_HTTP_WIRE_H_
