// HttpReader: the Reader backend for objects behind http:// and https:// URLs — ranged GETs on
// libcurl's multi interface, driven by one thread, many in flight on reused connections, each
// range written straight into its request's memory (nothing buffered beyond what the caller
// gave: bounded memory).
//
// Open() asks each URL for its first byte (following redirects, as the Hub's 302 to its CDN),
// all of them at once (ProbeHttp): the size from Content-Range, the validators (ETag, else
// Last-Modified). Requests to the Hub's endpoint carry its token (io/location.h). Every range after
// must answer 206 with the same validator and total size, or its request fails with Corruption
// naming the URL: an object replaced during a load never mixes two versions. A server that
// ignores Range (200) is refused, not read whole.
//
// Transient faults — a refused or reset connection, a body shorter than its range, no byte for
// stall_timeout_ms, HTTP 429, 500, 502, 503, 504 — are retried from the byte where the range
// stopped, at most `attempts` times in all, after a backoff (Retry-After when given, capped at
// max_backoff_ms); each retry counts in ReaderStats::resubmits. Permanent ones fail the
// request: 404/410 NotFound, 401/403 IOError naming the URL (check the token or credentials),
// anything else IOError with libcurl's words.
//
// With HttpReaderOptions::hub_cache, each request's bytes are written into the Hugging Face
// cache (io/hub_cache.h) on the reader's thread before its completion is posted.
//
// Semantics otherwise those of io/reader.h: requests are served in submission order, long
// ones cut into options.range_bytes ranges; Cancel() ends the ranges in flight at once (their
// connections closed) and fails the rest with Cancelled. Thread safety: as Reader.
// Destruction cancels, then joins the thread.
#ifndef LOADSTONE_IO_HTTP_READER_H_
#define LOADSTONE_IO_HTTP_READER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/reader.h"

namespace loadstone::io {

struct HttpReaderOptions {
  int connections = 16;                 // ranged GETs in flight at once (1..256)
  uint64_t range_bytes = 8ULL << 20;    // a request longer than this is cut (64 KiB..1 GiB)
  int attempts = 4;                     // tries per range for transient faults (1..100)
  int64_t connect_timeout_ms = 10000;   // per connection attempt
  // No byte for this long: a transient fault. libcurl averages a transfer's rate over its last
  // 5 s, so a stall after bytes came is seen up to 5 s later than this.
  int64_t stall_timeout_ms = 30000;
  int64_t max_backoff_ms = 5000;        // the longest wait before a retry, Retry-After included
  // Set: every range read is also written, once verified, into this Hugging Face cache, which
  // Finish() completes (io/hub_cache.h). Open() refuses a URL that is not a Hub file then.
  std::optional<HubCacheTarget> hub_cache;
};

// What Open() learned of one URL.
struct HttpObject {
  std::string url;            // as given
  std::string effective_url;  // after redirects
  uint64_t size = 0;
  std::string etag;           // empty when the server gave none
  std::string last_modified;  // empty when the server gave none
  // The Hub's, from the first answer (its 302 to the CDN, or the file itself): X-Linked-Etag
  // (an LFS file's sha256) and X-Repo-Commit; empty elsewhere.
  std::string linked_etag;
  std::string repo_commit;
  std::string protocol;  // what the probe's answer came over: "HTTP/1.1", "HTTP/2"

  // Which version of the object this is, for a catalog to check at its load: the Hub's linked
  // ETag (the same whichever CDN node answers), else the ETag, else Last-Modified.
  const std::string& version() const {
    return !linked_etag.empty() ? linked_etag : !etag.empty() ? etag : last_modified;
  }
};

// Probes each URL — asks for its first byte, following redirects — all at once on up to
// `options.connections` connections, transient faults retried as a range's are. One result per
// URL, in order: the object, or Open()'s errors for it (NotFound for 404/410).
std::vector<Result<HttpObject>> ProbeHttp(const std::vector<std::string>& urls,
                                          const HttpReaderOptions& options);

class HttpReader final : public Reader {
 public:
  // Probes every URL (at once) and starts the thread. Errors: InvalidArgument (options, a URL
  // that is not http://, https:// or s3://, an s3:// one without credentials), NotFound
  // (404/410), IOError (refused, unreachable, 401/403, a server that does not serve ranges),
  // naming the URL.
  static Result<std::unique_ptr<HttpReader>> Open(const std::vector<std::string>& urls,
                                                  const HttpReaderOptions& options);
  ~HttpReader() override;

  const std::vector<HttpObject>& objects() const;

  std::string Describe() const override;
  void Submit(std::span<const ReadRequest> requests) override;
  size_t Reap(std::vector<ReadCompletion>* out) override;
  int completion_fd() const override;
  size_t pending() const override;
  void Cancel() override;
  ReaderStats stats() const override;
  // The size the probe saw: a change since is caught by each range's Content-Range and
  // validator (the request fails), not here.
  Result<uint64_t> SizeNow(uint32_t file) const override;
  // With a cache (HttpReaderOptions::hub_cache): completes it (HubCache::Finish). REQUIRES:
  // nothing pending.
  std::string Finish() override;

 private:
  struct Impl;
  explicit HttpReader(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

// True for an error that says the server answered 403 (HttpReader's wording): S3 answers 403,
// not 404, for a key that is not there when the credentials may not list the bucket.
bool AccessRefused(const Status& status);
// For an s3:// address, the 403 of an object that may simply not be there (AccessRefused)
// counts as NotFound; anything else as it is.
bool AbsentObject(const std::string& url, const Status& status);

// True for the addresses HttpReader reads: http://, https:// and s3:// (any case of the scheme).
bool IsRemoteAddress(std::string_view path);

// One remote object read a few bytes at a time, synchronously (what a catalog reads of it: its
// header, as io::File::ReadExact does of a local file), through an HttpReader of its own.
// Thread-safe: reads are one at a time.
class RemoteObject {
 public:
  // Probes `url` (HttpReader::Open's errors).
  static Result<std::shared_ptr<RemoteObject>> Open(const std::string& url);
  const HttpObject& object() const { return object_; }
  // Exactly dst.size() bytes at `offset`. REQUIRES: offset + dst.size() <= object().size.
  Status Read(uint64_t offset, std::span<std::byte> dst);

 private:
  explicit RemoteObject(HttpObject object) : object_(std::move(object)) {}
  const HttpObject object_;
  std::mutex mu_;
  std::unique_ptr<HttpReader> reader_;  // guarded by mu_
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_HTTP_READER_H_
