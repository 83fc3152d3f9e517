// Readers under faults: injected EIO and truncation, slow and out-of-order completions,
// Cancel at random points, destruction with reads in flight.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <thread>

#include "io/fault_reader.h"
#include "io/reader_test_util.h"

namespace loadstone::io {
namespace {

using namespace testing;  // NOLINT

const std::string kTmp = std::filesystem::temp_directory_path().string();

std::unique_ptr<FaultInjectingReader> Wrap(std::unique_ptr<Reader> inner,
                                           const std::vector<std::string>& paths,
                                           FaultOptions options) {
  auto wrapped = FaultInjectingReader::Create(std::move(inner), paths, std::move(options));
  REQUIRE(wrapped.ok());
  return std::move(wrapped).value();
}

TEST_CASE("fault reader: EIO at a byte and truncation fail exactly the requests they cover") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  CAPTURE(Name(backend));
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  std::vector<std::string> paths = {dir.Path("a.bin"), dir.Path("b.bin")};
  WritePatternFile(paths[0], 0, 200'000);
  WritePatternFile(paths[1], 1, 200'000);
  auto inner = OpenOrSkip(paths, Options(backend));
  if (!inner) return;
  FaultOptions faults;
  faults.eio_at = {{0, 5000}};
  faults.truncate_at = {{1, 100'000}};
  auto reader = Wrap(std::move(inner), paths, faults);

  std::vector<std::byte> buf(400'000);
  std::vector<ReadRequest> requests = {
      {0, 0, 4096, buf.data(), 1},                   // before the bad byte
      {0, 4096, 4096, buf.data() + 4096, 2},         // covers it
      {0, 5000, 1, buf.data() + 10'000, 3},          // is it
      {0, 5001, 999, buf.data() + 20'000, 4},        // after it
      {1, 0, 100'000, buf.data() + 100'000, 5},      // up to the pretended end
      {1, 90'000, 20'000, buf.data() + 200'000, 6},  // across it
      {1, 5000, 100, buf.data() + 300'000, 7},       // file 1's byte 5000 is fine
  };
  reader->Submit(requests);
  auto done = DrainAll(*reader, requests.size());
  for (uint64_t ok_tag : {1, 4, 5, 7}) {
    const ReadRequest& r = requests[ok_tag - 1];
    INFO("tag " << ok_tag << " " << done[ok_tag].ToString());
    CHECK(done[ok_tag].ok());
    CHECK(FirstMismatch(r.dst, r.file, r.offset, r.length) == -1);
  }
  for (uint64_t eio_tag : {2, 3}) {
    INFO(done[eio_tag].ToString());
    CHECK(done[eio_tag].code() == StatusCode::kIOError);
    CHECK(done[eio_tag].message().find(paths[0]) != std::string_view::npos);
    CHECK(done[eio_tag].message().find("offset 5000") != std::string_view::npos);
  }
  INFO(done[6].ToString());
  CHECK(done[6].code() == StatusCode::kCorruption);
  CHECK(done[6].message().find(paths[1]) != std::string_view::npos);
  CHECK(done[6].message().find("ends at 100000") != std::string_view::npos);
  CHECK(reader->injected() == 3);
  CHECK(reader->pending() == 0);
}

TEST_CASE("fault reader: slow, out-of-order completions arrive exactly once") {
  const uint64_t seed = TestSeed("out of order");
  CAPTURE(seed);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("o.bin");
  WritePatternFile(path, 0, 1 << 20);
  auto inner = OpenOrSkip({path}, Options(ReaderBackend::kAuto));
  FaultOptions faults;
  faults.latency = std::chrono::milliseconds(2);
  faults.reorder_window = 8;
  faults.seed = seed;
  auto reader = Wrap(std::move(inner), {path}, faults);
  constexpr int kRequests = 64;
  std::vector<std::byte> buf(kRequests * 4096);
  std::vector<ReadRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back({0, static_cast<uint64_t>(i) * 8000, 4096, buf.data() + i * 4096,
                        static_cast<uint64_t>(i)});
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint64_t> order;
  for (const ReadRequest& r : requests) reader->Submit({&r, 1});
  std::vector<ReadCompletion> batch;
  while (order.size() < requests.size()) {
    pollfd pfd{reader->completion_fd(), POLLIN, 0};
    REQUIRE(::poll(&pfd, 1, 10'000) == 1);
    batch.clear();
    reader->Reap(&batch);
    for (const ReadCompletion& c : batch) {
      REQUIRE(c.status.ok());
      order.push_back(c.tag);
    }
  }
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(2));
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // once each
  CHECK_FALSE(std::is_sorted(order.begin(), order.end()));                  // out of order
  for (const ReadRequest& r : requests) CHECK(FirstMismatch(r.dst, 0, r.offset, 4096) == -1);
}

TEST_CASE("reader: Cancel at random points completes every request once") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const bool slow = GENERATE(false, true);  // through a fault wrapper that holds completions
  const uint64_t seed = TestSeed("cancel");
  CAPTURE(Name(backend), slow, seed);
  std::mt19937_64 rng(seed);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("c.bin");
  const uint64_t size = 8 << 20;
  WritePatternFile(path, 0, size);
  for (int round = 0; round < 12; ++round) {
    CAPTURE(round);
    ReaderOptions options = Options(backend);
    options.queue_depth = 8;
    options.max_chunk = 128 << 10;
    options.threads = 3;
    std::unique_ptr<Reader> reader = OpenOrSkip({path}, options);
    if (!reader) return;
    if (slow) {
      FaultOptions faults;
      faults.latency = std::chrono::microseconds(300);
      reader = Wrap(std::move(reader), {path}, faults);
    }
    constexpr int kRequests = 120;
    std::vector<std::vector<std::byte>> buffers(kRequests);
    std::vector<ReadRequest> requests;
    for (int i = 0; i < kRequests; ++i) {
      const uint64_t length = 1 + rng() % (512 << 10);
      buffers[i].resize(length);
      requests.push_back(
          {0, rng() % (size - length), length, buffers[i].data(), static_cast<uint64_t>(i)});
    }
    const size_t split = rng() % kRequests;
    reader->Submit(std::span(requests).first(split));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    std::thread canceller([&] { reader->Cancel(); });
    reader->Submit(std::span(requests).subspan(split));  // races with Cancel
    canceller.join();
    reader->Cancel();  // idempotent
    auto done = DrainAll(*reader, requests.size());
    for (const ReadRequest& r : requests) {
      const Status& s = done[r.tag];
      INFO("request " << r.tag << " " << s.ToString());
      REQUIRE((s.ok() || s.code() == StatusCode::kCancelled));
      if (s.ok()) REQUIRE(FirstMismatch(r.dst, 0, r.offset, r.length) == -1);
      if (!s.ok()) REQUIRE(s.message().find(path) != std::string_view::npos);
    }
    std::byte one;
    ReadRequest late{0, 0, 1, &one, 999};
    reader->Submit({&late, 1});
    CHECK(DrainAll(*reader, 1)[999].code() == StatusCode::kCancelled);
    CHECK(reader->pending() == 0);
  }
}

TEST_CASE("reader: destruction waits for reads in flight, nothing is written afterwards") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const bool wrapped = GENERATE(false, true);
  CAPTURE(Name(backend), wrapped);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("d.bin");
  const uint64_t size = 16 << 20;
  WritePatternFile(path, 0, size);
  ReaderOptions options = Options(backend);
  options.max_chunk = 1 << 20;
  std::unique_ptr<Reader> reader = OpenOrSkip({path}, options);
  if (!reader) return;
  if (wrapped)
    reader = Wrap(std::move(reader), {path}, FaultOptions{{}, {}, std::chrono::milliseconds(1)});
  std::vector<std::byte> buf(size);
  std::vector<ReadRequest> requests;
  for (uint64_t i = 0; i < 64; ++i)
    requests.push_back({0, i * (size / 64), size / 64, buf.data() + i * (size / 64), i});
  reader->Submit(requests);
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  reader.reset();  // cancels and waits
  std::memset(buf.data(), 0xEE, buf.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0xEE}; }));
}

}  // namespace
}  // namespace loadstone::io
