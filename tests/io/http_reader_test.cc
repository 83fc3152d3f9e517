// HttpReader against Debian's nginx on 127.0.0.1 (started and stopped here): exact bytes for
// random ranges of several objects, a redirect followed, a missing object, a server without
// ranges, an empty object, an object replaced during a load, a server that goes away, Cancel;
// through a fault proxy (testing/fault_proxy.h): resets, 503s, short bodies and stalls retried
// byte-exact, in probes too; a fault that outlasts the attempts and a 403 failing the read
// with a clear error, the reader reading on after.
#include "io/http_reader.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "io/reader_test_util.h"
#include "testing/fault_proxy.h"
#include "testing/nginx_server.h"

namespace loadstone::io {
namespace {

using namespace testing;  // NOLINT
using loadstone::testing::NginxServer;
using loadstone::testing::TempDir;

// The server, or nullptr after saying why the test is skipped.
std::unique_ptr<NginxServer> Serve(const TempDir& root) {
  std::string why;
  auto server = NginxServer::Start(root.path(), &why);
  if (!server) WARN("skipped: " << why);
  return server;
}

HttpReaderOptions Small() {
  HttpReaderOptions o;
  o.connections = 4;
  o.range_bytes = 64 << 10;  // many ranges per request
  o.max_backoff_ms = 50;
  return o;
}

TEST_CASE("http reader: random ranges of several objects are byte-exact", "[io][http]") {
  TempDir root;
  WritePatternFile(root.Path("a.bin"), 0, (5 << 20) + 777);
  WritePatternFile(root.Path("b.bin"), 1, 300 << 10);
  auto server = Serve(root);
  if (!server) return;
  auto reader = HttpReader::Open({server->Url("a.bin"), server->Url("b.bin")}, Small());
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  const auto& objects = (*reader)->objects();
  REQUIRE(objects.size() == 2);
  CHECK(objects[0].size == (5 << 20) + 777);
  CHECK(objects[1].size == 300 << 10);
  CHECK_FALSE(objects[0].etag.empty());  // nginx gives one: the load's validator
  CHECK((*reader)->Describe().find("http (libcurl ") == 0);
  CHECK(*(*reader)->SizeNow(1) == 300 << 10);

  std::mt19937_64 rng(TestSeed("http reader: random ranges"));
  std::vector<std::vector<std::byte>> buffers;
  std::vector<ReadRequest> requests;
  uint64_t total = 0;
  for (uint64_t tag = 0; tag < 120; ++tag) {
    const uint32_t file = rng() % 2;
    const uint64_t size = objects[file].size;
    const uint64_t offset = rng() % size;
    const uint64_t length = 1 + rng() % std::min<uint64_t>(size - offset, 400 << 10);
    buffers.emplace_back(length);
    requests.push_back({file, offset, length, buffers.back().data(), tag});
    total += length;
  }
  requests.push_back({0, 0, objects[0].size, nullptr, 999});  // the whole object, below
  std::vector<std::byte> whole(objects[0].size);
  requests.back().dst = whole.data();
  total += whole.size();
  ReadAllExact(**reader, requests);
  CHECK((*reader)->stats().bytes == total);
  CHECK((*reader)->stats().network_bytes == total);  // every body byte, none twice
  CHECK((*reader)->stats().resubmits == 0);
  CHECK((*reader)->pending() == 0);
}

TEST_CASE("http reader: redirects, a missing object, no ranges, an empty object", "[io][http]") {
  TempDir root;
  WritePatternFile(root.Path("a.bin"), 0, 100 << 10);
  root.Write("empty.bin", "");
  auto server = Serve(root);
  if (!server) return;

  auto moved = HttpReader::Open({server->Url("moved/a.bin")}, Small());
  INFO(moved.status().ToString());
  REQUIRE(moved.ok());
  CHECK((*moved)->objects()[0].effective_url == server->Url("a.bin"));
  std::vector<std::byte> dst(1000);
  ReadRequest r{0, 5000, dst.size(), dst.data(), 1};
  (*moved)->Submit({&r, 1});
  REQUIRE(DrainAll(**moved, 1)[1].ok());
  CHECK(FirstMismatch(dst.data(), 0, 5000, dst.size()) == -1);

  auto missing = HttpReader::Open({server->Url("nope.bin")}, Small());
  REQUIRE(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find(server->Url("nope.bin")) != std::string::npos);
  CHECK(missing.status().message().find("HTTP 404") != std::string::npos);

  auto whole = HttpReader::Open({server->Url("norange/a.bin")}, Small());
  REQUIRE(whole.status().code() == StatusCode::kIOError);
  CHECK(whole.status().message().find("does not serve byte ranges") != std::string::npos);

  auto empty = HttpReader::Open({server->Url("empty.bin")}, Small());
  INFO(empty.status().ToString());
  REQUIRE(empty.ok());
  CHECK((*empty)->objects()[0].size == 0);

  auto ftp = HttpReader::Open({"ftp://127.0.0.1/a.bin"}, Small());
  CHECK(ftp.status().code() == StatusCode::kInvalidArgument);
  // OpenReader picks HttpReader for addresses, and refuses a mix of remote and local files.
  auto picked = OpenReader({server->Url("a.bin")}, ReaderOptions());
  REQUIRE(picked.ok());
  CHECK((*picked)->Describe().find("http (libcurl ") == 0);
  auto mixed = OpenReader({server->Url("a.bin"), root.Path("a.bin")}, ReaderOptions());
  CHECK(mixed.status().code() == StatusCode::kUnsupported);
  CHECK(mixed.status().message().find("1 of the 2 files are remote") != std::string::npos);
}

TEST_CASE("http reader: an object replaced during a load fails its reads, naming it",
          "[io][http]") {
  TempDir root;
  const std::string path = root.Path("a.bin");
  WritePatternFile(path, 0, 1 << 20);
  auto server = Serve(root);
  if (!server) return;
  auto reader = HttpReader::Open({server->Url("a.bin")}, Small());
  REQUIRE(reader.ok());
  // Same size, other bytes and another modification time: nginx's ETag changes with it.
  WritePatternFile(path, 7, 1 << 20);
  const timespec times[2] = {{0, UTIME_OMIT}, {1700000000, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
  std::vector<std::byte> dst(256 << 10);
  ReadRequest r{0, 4096, dst.size(), dst.data(), 1};
  (*reader)->Submit({&r, 1});
  const Status s = DrainAll(**reader, 1)[1];
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kCorruption);
  CHECK(s.message().find("changed during the load (ETag") != std::string::npos);
  CHECK(s.message().find(server->Url("a.bin")) != std::string::npos);

  // Shorter now: the range past its end is refused as a change too.
  WritePatternFile(path, 0, 100 << 10);
  ReadRequest tail{0, 500 << 10, 1000, dst.data(), 2};
  (*reader)->Submit({&tail, 1});
  const Status cut = DrainAll(**reader, 1)[2];
  INFO(cut.ToString());
  CHECK(cut.code() == StatusCode::kCorruption);
  CHECK(cut.message().find("changed during the load") != std::string::npos);
}

TEST_CASE("http reader: a server that goes away is retried a bounded number of times, and Cancel "
          "ends reads at once", "[io][http]") {
  TempDir root;
  WritePatternFile(root.Path("a.bin"), 0, 16 << 20);
  auto server = Serve(root);
  if (!server) return;
  HttpReaderOptions options = Small();
  options.attempts = 3;
  auto reader = HttpReader::Open({server->Url("a.bin")}, options);
  REQUIRE(reader.ok());

  // Cancel with everything still to read: each request ends, OK or Cancelled, at once.
  std::vector<std::byte> big(16 << 20);
  std::vector<ReadRequest> requests;
  for (uint64_t i = 0; i < 16; ++i) {
    requests.push_back({0, i << 20, 1 << 20, big.data() + (i << 20), i});
  }
  (*reader)->Submit(requests);
  (*reader)->Cancel();
  const auto start = std::chrono::steady_clock::now();
  for (auto& [tag, status] : DrainAll(**reader, requests.size(), std::chrono::seconds(10))) {
    INFO(tag << " " << status.ToString());
    CHECK((status.ok() || status.code() == StatusCode::kCancelled));
    if (status.ok()) CHECK(FirstMismatch(big.data() + (tag << 20), 0, tag << 20, 1 << 20) == -1);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));

  // A fresh reader; then the server stops: refused connections, retried, then a clear error.
  auto again = HttpReader::Open({server->Url("a.bin")}, options);
  REQUIRE(again.ok());
  server->Stop();
  std::vector<std::byte> dst(1000);
  ReadRequest r{0, 0, dst.size(), dst.data(), 1};
  (*again)->Submit({&r, 1});
  const Status s = DrainAll(**again, 1, std::chrono::seconds(20))[1];
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kIOError);
  CHECK(s.message().find("failed 3 times") != std::string::npos);
  CHECK(s.message().find(server->Url("a.bin")) != std::string::npos);
  CHECK((*again)->stats().resubmits == 2);
}

using loadstone::testing::Fault;
using loadstone::testing::FaultProxy;

// Each of `requests` of pattern file 0, spread over `size` bytes.
std::vector<ReadRequest> Spread(uint64_t size, size_t count, std::vector<std::vector<std::byte>>* buffers) {
  std::vector<ReadRequest> requests;
  const uint64_t step = size / count;
  buffers->resize(count);
  for (size_t i = 0; i < count; ++i) {
    (*buffers)[i].resize(step);
    requests.push_back({0, i * step, step, (*buffers)[i].data(), i});
  }
  return requests;
}

TEST_CASE("http reader: through a fault proxy, transient faults are retried and the bytes exact",
          "[io][http][faults]") {
  TempDir root;
  WritePatternFile(root.Path("a.bin"), 0, 2 << 20);
  auto server = Serve(root);
  if (!server) return;
  std::string why;
  // The probe meets a 503 and a short answer first; then the ranges meet one of each.
  auto proxy = FaultProxy::Start(server->port(),
                                 {Fault::kUnavailable, Fault::kTruncate, Fault::kNone,
                                  Fault::kReset, Fault::kUnavailable, Fault::kTruncate,
                                  Fault::kStall, Fault::kReset},
                                 &why);
  REQUIRE(proxy);
  HttpReaderOptions options = Small();
  options.stall_timeout_ms = 1000;  // the stall: given up within 1 + 5 s (libcurl's rate window)
  const auto start = std::chrono::steady_clock::now();
  auto reader = HttpReader::Open({proxy->Url("a.bin")}, options);
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  CHECK((*reader)->objects()[0].size == 2 << 20);
  std::vector<std::vector<std::byte>> buffers;
  const std::vector<ReadRequest> requests = Spread(2 << 20, 8, &buffers);
  ReadAllExact(**reader, requests);
  CHECK(proxy->faults_served() == 7);
  CHECK((*reader)->stats().resubmits == 5);  // the ranges' faults (the probe's are its own)
  CHECK((*reader)->stats().bytes == 2 << 20);
  // A retry asks for what its range still lacks: no byte came twice.
  CHECK((*reader)->stats().network_bytes == 2 << 20);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));
}

TEST_CASE("http reader: through a fault proxy, a fault past the attempts and a 403 fail the read, "
          "and the reader reads on", "[io][http][faults]") {
  TempDir root;
  WritePatternFile(root.Path("a.bin"), 0, 1 << 20);
  auto server = Serve(root);
  if (!server) return;
  std::string why;
  auto proxy = FaultProxy::Start(server->port(), std::vector<Fault>(4, Fault::kUnavailable), &why);
  REQUIRE(proxy);
  // A probe that meets a 503 every time it asks: Open fails, saying so.
  auto refused = HttpReader::Open({proxy->Url("a.bin")}, Small());
  CHECK(refused.status().code() == StatusCode::kIOError);
  CHECK(refused.status().message().find("HTTP 503") != std::string::npos);
  CHECK(refused.status().message().find("failed 4 times") != std::string::npos);
  CHECK(proxy->faults_served() == 4);

  proxy->Schedule({});
  auto reader = HttpReader::Open({proxy->Url("a.bin")}, Small());
  REQUIRE(reader.ok());
  std::vector<std::byte> dst(32 << 10);  // one range: every reset meets the same one
  proxy->Schedule(std::vector<Fault>(4, Fault::kReset));
  ReadRequest r{0, 4096, dst.size(), dst.data(), 1};
  (*reader)->Submit({&r, 1});
  const Status s = DrainAll(**reader, 1, std::chrono::seconds(20))[1];
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kIOError);
  CHECK(s.message().find("failed 4 times") != std::string::npos);
  CHECK(s.message().find(proxy->Url("a.bin")) != std::string::npos);

  proxy->Schedule({Fault::kForbidden});
  ReadRequest denied{0, 0, dst.size(), dst.data(), 2};
  (*reader)->Submit({&denied, 1});
  const Status forbidden = DrainAll(**reader, 1, std::chrono::seconds(20))[2];
  INFO(forbidden.ToString());
  CHECK(forbidden.code() == StatusCode::kIOError);
  CHECK(forbidden.message().find("HTTP 403") != std::string::npos);
  CHECK(forbidden.message().find("check the token or credentials") != std::string::npos);
  const uint64_t resubmits = (*reader)->stats().resubmits;
  CHECK(resubmits == 3);  // the resets' retries; a 403 is not retried

  // The faults spent: the same reader reads on, byte-exact.
  std::vector<std::vector<std::byte>> buffers;
  ReadAllExact(**reader, Spread(1 << 20, 4, &buffers));
  CHECK((*reader)->stats().resubmits == resubmits);
}

}  // namespace
}  // namespace loadstone::io
