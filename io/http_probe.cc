// ProbeHttp (http_reader.h): a GET of byte 0 of every URL at once on one multi handle, each
// answer read into an HttpObject (its size, versions, the address redirects end at), transient
// faults retried after RetryDelay. Every wait is bounded: each try by connect + stall timeout,
// the tries by options.attempts.
#include <curl/curl.h>

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "io/http_reader.h"
#include "io/http_wire.h"
#include "io/location.h"

namespace loadstone::io {
namespace {

// The probe's body: the one byte asked for, or an error page; more (a server that ignores Range
// and sends the whole object, an endless error page) aborts the transfer, with the answer's
// headers kept, rather than download it.
size_t ProbeBody(char*, size_t size, size_t n, void* user) {
  auto& answer = *static_cast<Answer*>(user);
  answer.body_bytes += size * n;
  const uint64_t most = answer.status == 200 ? 1 : 64 << 10;
  return answer.body_bytes > most ? 0 : size * n;
}

struct ProbeState {
  HttpObject object;
  Answer answer;
  char error[CURL_ERROR_SIZE] = {};
  RequestAuth auth;
  CURL* easy = nullptr;  // while on the multi handle
  int attempt = 0;
  Clock::time_point not_before{};
  bool done = false;
  Status status;
};

Status SetUp(ProbeState& p, const HttpReaderOptions& options) {
  p.easy = curl_easy_init();
  if (p.easy == nullptr) return Status::OutOfMemory("libcurl could not make a handle");
  p.answer = Answer();
  p.error[0] = '\0';
  CURL* easy = p.easy;
  CommonOptions(easy, options);
  curl_easy_setopt(easy, CURLOPT_URL, p.auth.address.c_str());
  curl_easy_setopt(easy, CURLOPT_RANGE, "0-0");
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, &p.answer);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ProbeBody);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &p.answer);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, p.error);
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 0L);  // a 416 (an empty object) is an answer
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(options.connect_timeout_ms + options.stall_timeout_ms));
  p.auth.Apply(easy);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, &p);
  return Status::OK();
}

// What the answer of a finished try says of its object; *retry when the fault is transient.
Status Outcome(ProbeState& p, CURLcode code, bool* retry) {
  *retry = false;
  HttpObject& object = p.object;
  const Answer& answer = p.answer;
  if (code != CURLE_OK && !(code == CURLE_WRITE_ERROR && answer.status != 0)) {
    *retry = TransientCurl(code);
    std::string hint;
    if (code == CURLE_SSL_CACERT_BADFILE) {
      hint = fmt::format("; the certificate authorities given ('{}') could not be read",
                         p.auth.ca_bundle);
    } else if (code == CURLE_PEER_FAILED_VERIFICATION) {
      hint = fmt::format(
          "; a server whose certificate comes from your own authority needs that authority in "
          "{}REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE, SSL_CERT_FILE)",
          IsS3Address(object.url) ? "AWS_CA_BUNDLE, " : "");
    }
    return Status::IOError(fmt::format("cannot reach '{}': {}{}", object.url,
                                       p.error[0] ? p.error : curl_easy_strerror(code), hint));
  }
  char* effective = nullptr;
  curl_easy_getinfo(p.easy, CURLINFO_EFFECTIVE_URL, &effective);
  object.effective_url = effective ? effective : p.auth.address;
  object.etag = answer.etag;
  object.last_modified = answer.last_modified;
  long version = 0;
  curl_easy_getinfo(p.easy, CURLINFO_HTTP_VERSION, &version);
  object.protocol = version == CURL_HTTP_VERSION_2_0 ? "HTTP/2"
                    : version == CURL_HTTP_VERSION_3 ? "HTTP/3"
                    : version == CURL_HTTP_VERSION_1_0 ? "HTTP/1.0"
                                                       : "HTTP/1.1";
  object.linked_etag = answer.linked_etag;
  object.repo_commit = answer.repo_commit;
  if (answer.status == 206 && answer.has_range && !answer.unsatisfied && answer.first == 0) {
    object.size = answer.total;
    return Status::OK();
  }
  // An empty object has no byte 0: 416 with bytes */0, or (nginx) a 200 with no body.
  if ((answer.status == 416 && answer.has_range && answer.unsatisfied && answer.total == 0) ||
      (answer.status == 200 && answer.content_length == 0)) {
    object.size = 0;
    return Status::OK();
  }
  if (answer.status == 200) {
    return Status::IOError(fmt::format(
        "'{}' does not serve byte ranges (it answered 200 to a Range request): loadstone reads "
        "ranges and will not download the whole object to memory; serve it with range support",
        object.url));
  }
  if (answer.status >= 400) {
    *retry = Transient(answer.status);
    return HttpError(answer.status, object.url, "a request for byte 0");
  }
  return Status::IOError(fmt::format(
      "'{}' answered HTTP {} to a request for byte 0{}: expected 206 with a Content-Range",
      object.url, answer.status, answer.has_range ? "" : " without a Content-Range"));
}

// Puts the probes that are due and not yet out on `multi`, at most options.connections out at
// once (a wait in libcurl's queue would count against a probe's timeout); false when none is
// left to finish.
bool StartDue(std::vector<std::unique_ptr<ProbeState>>& probes, CURLM* multi,
              const HttpReaderOptions& options, int* timeout_ms) {
  const auto now = Clock::now();
  bool left = false;
  *timeout_ms = 1000;
  int out = 0;
  for (const auto& p : probes) out += p->easy != nullptr;
  for (auto& p : probes) {
    if (p->done) continue;
    left = true;
    if (p->easy != nullptr || out >= options.connections) continue;
    if (p->not_before > now) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(p->not_before - now);
      *timeout_ms = std::clamp(static_cast<int>(wait.count()), 0, *timeout_ms);
      continue;
    }
    Status set_up = SetUp(*p, options);
    if (!set_up.ok()) {
      p->status = std::move(set_up);
      p->done = true;
      continue;
    }
    if (curl_multi_add_handle(multi, p->easy) != CURLM_OK) {
      curl_easy_cleanup(p->easy);
      p->easy = nullptr;
      p->status = Status::OutOfMemory("libcurl could not take another transfer");
      p->done = true;
      continue;
    }
    ++out;
  }
  return left;
}

// Settles the probes whose tries ended: done, or due again after their RetryDelay; how many.
int Reap(CURLM* multi, const HttpReaderOptions& options) {
  int queued = 0, settled = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi, &queued)) {
    if (msg->msg != CURLMSG_DONE) continue;
    ++settled;
    ProbeState* p = nullptr;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &p);
    bool retry = false;
    Status outcome = Outcome(*p, msg->data.result, &retry);
    curl_multi_remove_handle(multi, p->easy);
    curl_easy_cleanup(p->easy);
    p->easy = nullptr;
    if (retry && ++p->attempt < options.attempts) {
      p->not_before = Clock::now() + RetryDelay(p->attempt, p->answer.retry_after_ms, options);
      continue;
    }
    if (retry) outcome = Exhausted("asking for the first byte", p->object.url, p->attempt, outcome);
    p->status = std::move(outcome);
    p->done = true;
  }
  return settled;
}

}  // namespace

std::vector<Result<HttpObject>> ProbeHttp(const std::vector<std::string>& urls,
                                          const HttpReaderOptions& options) {
  std::vector<Result<HttpObject>> out;
  const Status init = InitCurl();
  CURLM* multi = init.ok() ? curl_multi_init() : nullptr;
  if (multi == nullptr) {
    for (size_t i = 0; i < urls.size(); ++i) {
      out.emplace_back(init.ok() ? Status::OutOfMemory("libcurl could not make a multi handle")
                                 : init);
    }
    return out;
  }
  curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(options.connections));
  std::vector<std::unique_ptr<ProbeState>> probes;
  for (const std::string& url : urls) {
    auto p = std::make_unique<ProbeState>();
    p->object.url = url;
    Result<RequestAuth> auth = IsRemoteAddress(url)
                                   ? AuthFor(url, url)
                                   : Status::InvalidArgument(fmt::format(
                                         "'{}' is not an http://, https:// or s3:// address", url));
    if (auth.ok()) {
      p->auth = std::move(auth).value();
    } else {
      p->status = auth.status();
      p->done = true;
    }
    probes.push_back(std::move(p));
  }
  int timeout_ms = 0;
  while (StartDue(probes, multi, options, &timeout_ms)) {
    int running = 0;
    curl_multi_perform(multi, &running);
    // Something settled: start what is due before waiting (the wait is then known afresh).
    if (Reap(multi, options) > 0) continue;
    curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
  }
  curl_multi_cleanup(multi);
  for (auto& p : probes) {
    if (p->status.ok()) {
      out.emplace_back(std::move(p->object));
    } else {
      out.emplace_back(std::move(p->status));
    }
  }
  return out;
}

}  // namespace loadstone::io
