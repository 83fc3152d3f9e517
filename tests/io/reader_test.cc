// The Reader backends (io_uring and pread) against pattern files: exact bytes for random
// ranges, chunking, deep queues, end of file and truncation, concurrent submitters, O_DIRECT,
// OpenReader's choice, and a ring that refuses submissions. Faults and cancellation:
// reader_fault_test.cc.
#include "io/reader.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "io/posix_error.h"
#include "io/read_state.h"
#include "io/reader_wrapper.h"
#include "io/reader_test_util.h"
#include "io/uring_reader.h"

namespace loadstone::io {
namespace {

using namespace testing;  // NOLINT

const std::string kTmp = std::filesystem::temp_directory_path().string();

TEST_CASE("reader: pieces are cut by alignment and chunk size") {
  CutPolicy p;
  p.max_chunk = 1 << 20;
  auto* base = reinterpret_cast<const std::byte*>(uintptr_t{1} << 20);  // page aligned
  SECTION("without O_DIRECT every piece is a buffered chunk") {
    auto cut = CutPiece(7, base + 3, 5 << 20, p);
    CHECK(cut.kind == PieceKind::kBuffered);
    CHECK(cut.length == (1 << 20));
  }
  p.align = 4096;
  p.bounce_slot = 1 << 20;
  SECTION("in phase: buffered head, direct middle, buffered tail") {
    auto head = CutPiece(4096 + 100, base + 100, 3 << 20, p);
    CHECK(head.kind == PieceKind::kBuffered);
    CHECK(head.length == 3996);
    auto middle = CutPiece(8192, base + 4096, (3 << 20) - 3996, p);
    CHECK(middle.kind == PieceKind::kDirect);
    CHECK(middle.length == (1 << 20));
    auto tail = CutPiece(8192, base, 1000, p);
    CHECK(tail.kind == PieceKind::kBuffered);
    CHECK(tail.length == 1000);
  }
  SECTION("out of phase: an aligned superset in a bounce slot") {
    auto cut = CutPiece(4096 + 100, base + 7, 3 << 20, p);
    CHECK(cut.kind == PieceKind::kBounce);
    CHECK(cut.length == (1 << 20) - 100);  // superset [4096, 4096 + 1 MiB) fills the slot
    auto small = CutPiece(100, base + 7, 1000, p);
    CHECK(small.kind == PieceKind::kBuffered);
  }
  SECTION("no bounce slots: out-of-phase pieces go through the page cache") {
    p.bounce_slot = 0;
    auto cut = CutPiece(4096 + 100, base + 7, 3 << 20, p);
    CHECK(cut.kind == PieceKind::kBuffered);
    CHECK(cut.length == (1 << 20));
  }
}

TEST_CASE("reader: a piece's next read call is direct only when all of it is aligned") {
  auto* base = reinterpret_cast<std::byte*>(uintptr_t{1} << 20);  // page aligned
  ReadPiece piece;
  piece.kind = PieceKind::kDirect;
  piece.start = 8192;
  piece.base = base;
  piece.want = 3 << 20;
  SECTION("aligned: direct, the whole rest") {
    ReadCall call = NextCall(piece, 4096, 0);
    CHECK(call.direct);
    CHECK(call.at == 8192);
    CHECK(call.to == base);
    CHECK(call.length == (3u << 20));
  }
  SECTION("after a short read of 100 bytes the rest goes through the page cache") {
    piece.got = 100;
    ReadCall call = NextCall(piece, 4096, 0);
    CHECK_FALSE(call.direct);
    CHECK(call.at == 8292);
    CHECK(call.to == base + 100);
    CHECK(call.length == (3u << 20) - 100);
  }
  SECTION("a cap on each call is rounded down to the alignment, never below it") {
    CHECK(NextCall(piece, 4096, 10000).length == 8192);
    CHECK(NextCall(piece, 4096, 1000).length == 4096);
    piece.kind = PieceKind::kBuffered;  // buffered: capped exactly
    CHECK_FALSE(NextCall(piece, 4096, 10000).direct);
    CHECK(NextCall(piece, 4096, 10000).length == 10000);
  }
  SECTION("no O_DIRECT for the file") { CHECK_FALSE(NextCall(piece, 0, 0).direct); }
}

TEST_CASE("reader: errno becomes a typed Status naming what failed and the fix") {
  Status missing = ErrnoStatus(ENOENT, "cannot open", "/m/a.safetensors");
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.message()), Catch::Contains("cannot open '/m/a.safetensors'"));
  Status denied = ErrnoStatus(EACCES, "cannot open", "/m/a.safetensors");
  CHECK(denied.code() == StatusCode::kIOError);
  CHECK_THAT(std::string(denied.message()), Catch::Contains("permissions"));
  Status no_file = ErrnoStatus(ENOMEM, "registering 4096 bytes with userfaultfd");
  CHECK(no_file.code() == StatusCode::kOutOfMemory);
  CHECK(no_file.message() ==
        fmt::format("registering 4096 bytes with userfaultfd: {}", std::strerror(ENOMEM)));
}

TEST_CASE("reader: random ranges read exact bytes") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const uint64_t max_read_call = GENERATE(uint64_t{0}, uint64_t{3000});  // 3000: short reads
  const bool cold = GENERATE(true, false);  // files dropped from the page cache, or not
  const uint64_t seed = TestSeed("random ranges");
  CAPTURE(Name(backend), max_read_call, cold, seed);
  std::mt19937_64 rng(seed);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const uint64_t sizes[2] = {(6 << 20) + 1234, (1 << 20) + 4096};
  std::vector<std::string> paths = {dir.Path("a.bin"), dir.Path("b.bin")};
  std::vector<std::unique_ptr<CachePin>> pins;  // warm: the files stay in the page cache
  for (uint32_t f = 0; f < 2; ++f) {
    WritePatternFile(paths[f], f, sizes[f]);
    if (cold) DropFromCache(paths[f]);
    if (!cold) pins.push_back(std::make_unique<CachePin>(paths[f]));
  }

  ReaderOptions options = Options(backend);
  options.queue_depth = 8;        // fewer than the requests
  options.max_chunk = 256 << 10;  // so that long requests cross chunks
  options.bounce_bytes = 1 << 20;
  options.threads = 4;
  options.max_read_call = max_read_call;
  auto reader = OpenOrSkip(paths, options);
  if (!reader) return;
  INFO(reader->Describe());

  constexpr int kRequests = 400;
  std::vector<ReadRequest> requests;
  std::vector<AlignedBytes> buffers;
  for (int i = 0; i < kRequests; ++i) {
    ReadRequest r;
    r.file = static_cast<uint32_t>(rng() % 2);
    const uint64_t size = sizes[r.file];
    switch (rng() % 4) {
      case 0:
        r.length = 0;
        break;
      case 1:
        r.length = 1 + rng() % 5000;
        break;
      case 2:
        r.length = 1 + rng() % (1 << 20);
        break;
      default:
        r.length = (1 + rng() % 64) * 4096;
        break;
    }
    r.length = std::min(r.length, size);
    r.offset = rng() % 3 == 0 ? (rng() % (size / 4096)) * 4096 : rng() % (size - r.length + 1);
    if (r.offset + r.length > size) r.offset = size - r.length;
    buffers.emplace_back(r.length);
    // Half of the destinations in phase with the file offset (O_DIRECT straight in), the rest
    // anywhere (bounce buffers or the page cache).
    const size_t misalign = rng() % 2 == 0 ? r.offset % 4096 : rng() % 4096;
    r.dst = buffers.back().At(misalign);
    r.tag = static_cast<uint64_t>(i);
    requests.push_back(r);
  }
  for (size_t begin = 0; begin < requests.size();) {  // batches of 1..40
    const size_t n = std::min<size_t>(1 + rng() % 40, requests.size() - begin);
    reader->Submit(std::span(requests).subspan(begin, n));
    begin += n;
  }
  auto done = DrainAll(*reader, requests.size());
  for (const ReadRequest& r : requests) {
    INFO("request " << r.tag << ": file " << r.file << " offset " << r.offset << " length "
                    << r.length << " dst%4096 " << reinterpret_cast<uintptr_t>(r.dst) % 4096);
    REQUIRE(done[r.tag].ok());
    REQUIRE(FirstMismatch(r.dst, r.file, r.offset, r.length) == -1);
  }
  CHECK(reader->pending() == 0);
  const ReaderStats stats = reader->stats();
  CHECK(stats.requests == kRequests);
  if (max_read_call > 0) CHECK(stats.resubmits > 0);
  if (!cold) {
    // All of it was in the page cache, so none of it was read with O_DIRECT. Where the pages
    // could not be locked there (RLIMIT_MEMLOCK) and memory pressure evicted some, the premise
    // is gone and so is the check.
    const bool cached = std::all_of(pins.begin(), pins.end(), [](const auto& pin) {
      return pin->pinned() || pin->AllResident();
    });
    if (cached) {
      CHECK(stats.direct_bytes == 0);
    } else {
      WARN("pages evicted from the page cache during the test; direct_bytes not checked");
    }
  }
}

TEST_CASE("reader: deep queue with many more requests than the ring") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  CAPTURE(Name(backend));
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("deep.bin");
  WritePatternFile(path, 0, 4 << 20);
  ReaderOptions options = Options(backend);
  options.queue_depth = 2;
  options.threads = 2;
  auto reader = OpenOrSkip({path}, options);
  if (!reader) return;
  constexpr int kRequests = 3000;
  std::vector<std::byte> dst(kRequests * 1000);
  std::vector<ReadRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back({0, static_cast<uint64_t>(i) * 1000 + 17, 1000, dst.data() + i * 1000,
                        static_cast<uint64_t>(i)});
  }
  reader->Submit(requests);
  auto done = DrainAll(*reader, kRequests);
  for (auto& [tag, status] : done) REQUIRE(status.ok());
  CHECK(FirstMismatch(dst.data(), 0, 17, dst.size()) == -1);
}

// max_bytes_in_flight bounds the bytes of pieces out at once, whatever their kind: pieces read
// straight into place with O_DIRECT (cold, on /var/tmp when it is a disk), bounced ones and
// ones through the page cache (tmpfs); without it the queue depth alone bounds them.
TEST_CASE("reader: max_bytes_in_flight bounds the bytes out at once, and every byte arrives") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const bool disk = GENERATE(false, true);
  const uint64_t cap = GENERATE(uint64_t{0}, uint64_t{3} << 20);
  CAPTURE(Name(backend), disk, cap);
  const std::string base = disk ? "/var/tmp" : kTmp;
  if (disk && (!std::filesystem::is_directory(base) || OnTmpfs(base))) {
    WARN("skipped: /var/tmp is missing or on tmpfs");
    return;
  }
  ScratchDir dir(base);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("bound.bin");
  constexpr uint64_t kFile = 32ULL << 20, kChunk = 1ULL << 20;
  WritePatternFile(path, 0, kFile);
  DropFromCache(path);
  ReaderOptions options = Options(backend);
  options.queue_depth = 16;
  options.threads = 16;
  options.max_chunk = kChunk;
  options.max_bytes_in_flight = cap;
  auto reader = OpenOrSkip({path}, options);
  if (!reader) return;
  if (cap != 0) CHECK(reader->Describe().find("at most 3 MiB in flight") != std::string::npos);
  // One read straight into place, one bounced (out of phase): 16 + 8 pieces of 1 MiB.
  AlignedBytes in_phase(16 << 20), out_of_phase(8 << 20);
  std::vector<ReadRequest> requests = {{0, 0, 16 << 20, in_phase.At(0), 1},
                                       {0, (20 << 20) + 10, 8 << 20, out_of_phase.At(3), 2}};
  ReadAllExact(*reader, requests);
  const uint64_t peak = reader->stats().peak_bytes_in_flight;
  CHECK(peak >= kChunk);  // a piece was out, and counted
  if (cap != 0) {
    CHECK(peak <= cap);  // pieces of 1 MiB under a 3 MiB bound
  } else if (backend == ReaderBackend::kUring) {
    CHECK(peak > (3ULL << 20));  // the ring takes queue_depth pieces at once
  }
}

TEST_CASE("reader: a read past the end of the file is Corruption naming path and offset") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const bool truncate_after_open = GENERATE(false, true);
  CAPTURE(Name(backend), truncate_after_open);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("short.bin");
  WritePatternFile(path, 0, truncate_after_open ? (4 << 20) : 300'000);
  ReaderOptions options = Options(backend);
  options.max_chunk = 64 << 10;
  DropFromCache(path);
  auto reader = OpenOrSkip({path}, options);
  if (!reader) return;
  if (truncate_after_open) REQUIRE(::truncate(path.c_str(), 300'000) == 0);

  AlignedBytes buffer(1 << 20);
  std::vector<ReadRequest> requests = {
      {0, 0, 100'000, buffer.At(0), 1},                  // inside: fine
      {0, 200'000, 200'000, buffer.At(0) + 100'000, 2},  // runs past the end
      {0, 409'600, 8192, buffer.At(0) + 400'000, 3},     // starts past the end, aligned
      {0, 299'999, 1, buffer.At(0) + 500'000, 4},        // the last byte: fine
      {0, 262'144, 65'536, buffer.At(0) + 600'000 - (600'000 % 4096), 5},  // in phase
  };
  reader->Submit(requests);
  auto done = DrainAll(*reader, requests.size());
  CHECK(done[1].ok());
  CHECK(done[4].ok());
  CHECK(FirstMismatch(buffer.At(0), 0, 0, 100'000) == -1);
  for (uint64_t tag : {2, 3, 5}) {
    INFO(done[tag].ToString());
    CHECK(done[tag].code() == StatusCode::kCorruption);
    CHECK(done[tag].message().find(path) != std::string_view::npos);
    CHECK(done[tag].message().find("truncated") != std::string_view::npos);
  }
  CHECK(done[2].message().find("offset 200000") != std::string_view::npos);
  CHECK(done[2].message().find("200000 bytes") != std::string_view::npos);
}

TEST_CASE("reader: bad requests fail alone with InvalidArgument") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  CAPTURE(Name(backend));
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("x.bin");
  WritePatternFile(path, 0, 10'000);
  auto reader = OpenOrSkip({path}, Options(backend));
  if (!reader) return;
  std::byte byte[16];
  std::vector<ReadRequest> requests = {
      {1, 0, 1, byte, 1},                 // no file #1
      {0, ~uint64_t{0} - 2, 8, byte, 2},  // offset + length overflows
      {0, 0, 8, nullptr, 3},              // nowhere to put it
      {0, 5, 16, byte, 4},                // fine
  };
  reader->Submit(requests);
  auto done = DrainAll(*reader, requests.size());
  CHECK(done[1].code() == StatusCode::kInvalidArgument);
  CHECK(done[2].code() == StatusCode::kInvalidArgument);
  CHECK(done[3].code() == StatusCode::kInvalidArgument);
  CHECK(done[4].ok());
  CHECK(FirstMismatch(byte, 0, 5, 16) == -1);
}

TEST_CASE("reader: concurrent submitters, one reaper") {
  const ReaderBackend backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  const uint64_t seed = TestSeed("concurrent submitters");
  CAPTURE(Name(backend), seed);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("c.bin");
  const uint64_t size = 3 << 20;
  WritePatternFile(path, 0, size);
  ReaderOptions options = Options(backend);
  options.queue_depth = 16;
  options.max_chunk = 128 << 10;
  auto reader = OpenOrSkip({path}, options);
  if (!reader) return;

  constexpr int kThreads = 4, kPerThread = 150;
  std::vector<ReadRequest> requests(kThreads * kPerThread);
  std::vector<std::vector<std::byte>> buffers(requests.size());
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < requests.size(); ++i) {
    const uint64_t length = rng() % (300 << 10);
    buffers[i].resize(length + 1);
    requests[i] = {0, rng() % (size - length), length, buffers[i].data(), i};
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed + static_cast<uint64_t>(t));
      auto mine = std::span(requests).subspan(static_cast<size_t>(t) * kPerThread, kPerThread);
      for (size_t begin = 0; begin < mine.size();) {
        const size_t n = std::min<size_t>(1 + local() % 10, mine.size() - begin);
        reader->Submit(mine.subspan(begin, n));
        begin += n;
      }
    });
  }
  auto done = DrainAll(*reader, requests.size());
  for (std::thread& t : threads) t.join();
  for (const ReadRequest& r : requests) {
    INFO("request " << r.tag);
    REQUIRE(done[r.tag].ok());
    REQUIRE(FirstMismatch(r.dst, 0, r.offset, r.length) == -1);
  }
}

TEST_CASE("reader: O_DIRECT is used on a disk file system for data not in the page cache") {
  const std::string base = "/var/tmp";
  if (!std::filesystem::is_directory(base) || OnTmpfs(base)) {
    WARN("skipped: /var/tmp is missing or on tmpfs, which has no O_DIRECT to use");
    return;
  }
  ScratchDir dir(base);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("direct.bin");
  WritePatternFile(path, 0, (8 << 20) + 777);
  DropFromCache(path);
  auto reader = OpenOrSkip({path}, Options(ReaderBackend::kUring));
  if (!reader) return;
  const std::string describe = reader->Describe();
  if (describe.find("O_DIRECT ready on") == std::string::npos) {
    WARN("skipped: the file system under /var/tmp refuses O_DIRECT: " << describe);
    return;
  }
  CHECK(reader->ReadsDirect(0, 0, 8 << 20));  // cold, O_DIRECT: the device would be read
  AlignedBytes in_phase(8 << 20), out_of_phase(4 << 20), tail(4096);
  std::vector<ReadRequest> requests = {
      {0, 0, 8 << 20, in_phase.At(0), 1},              // straight into the buffer
      {0, 4096 + 10, 4 << 20, out_of_phase.At(3), 2},  // through a bounce buffer
      {0, (8 << 20) - 100, 877, tail.At(5), 3},        // the tail, past the last block
  };
  ReadAllExact(*reader, requests);
  const ReaderStats stats = reader->stats();
  INFO(describe);
  CHECK(stats.direct_bytes >= (12ULL << 20));
  CHECK(stats.bounced_bytes >= (4ULL << 20) - 4096);  // a tiny tail may go buffered
  CHECK(stats.bytes == (12ULL << 20) + 877);

  // Once the file is in the page cache (read through it by the pread reader), the same read
  // is copied from the cache instead of going to the device again.
  ReadRequest all{0, 0, (8 << 20) + 777, in_phase.At(0), 9};
  std::vector<std::byte> scratch((8 << 20) + 777);
  ReadRequest warm_up{0, 0, scratch.size(), scratch.data(), 10};
  auto pread = OpenOrSkip({path}, Options(ReaderBackend::kPread));  // fills the page cache
  pread->Submit({&warm_up, 1});
  REQUIRE(DrainAll(*pread, 1)[10].ok());
  CHECK_FALSE(reader->ReadsDirect(0, 0, 8 << 20));  // cached now: copied from the cache
  CHECK_FALSE(pread->ReadsDirect(0, 0, 8 << 20));   // the pread reader never uses O_DIRECT
  reader->Submit({&all, 1});
  REQUIRE(DrainAll(*reader, 1)[9].ok());
  CHECK(FirstMismatch(all.dst, 0, 0, all.length) == -1);
  CHECK(reader->stats().direct_bytes == stats.direct_bytes);  // no more device reads
}

// This process's file-backed resident memory (/proc/self/status RssFile), or -1.
int64_t RssFileKiB() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssFile:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

TEST_CASE("reader: CachedView maps cached ranges only, wrappers hide it") {
  ScratchDir dir("/var/tmp");
  REQUIRE(dir.ok());
  const std::string path = dir.Path("view.bin");
  const uint64_t size = (4 << 20) + 333;
  WritePatternFile(path, 1, size);  // just written: in the page cache
  const auto backend = GENERATE(ReaderBackend::kUring, ReaderBackend::kPread);
  auto reader = OpenOrSkip({path}, Options(backend));
  if (!reader) return;
  const std::byte* view = reader->CachedView(0, 4096 + 5, size - 4096 - 5);
  REQUIRE(view != nullptr);
  const int64_t before = RssFileKiB();
  CHECK(FirstMismatch(view, 1, 4096 + 5, size - 4096 - 5) == -1);  // maps the pages in
  const int64_t touched = RssFileKiB();
  ReleaseCachedView(view, size - 4096 - 5);
  const int64_t released = RssFileKiB();
  INFO("RssFile KiB: " << before << " -> " << touched << " -> " << released);
  CHECK(touched - before >= 3 * 1024);
  CHECK(touched - released >= 3 * 1024);  // unmapped again (all but the partial last page)
  CHECK(FirstMismatch(view, 1, 4096 + 5, 100) == -1);  // and still readable: mapped again
  CHECK(reader->CachedView(0, size - 10, 11) == nullptr);  // past the end
  CHECK(reader->CachedView(1, 0, 10) == nullptr);          // no such file
  {
    ReaderWrapper wrapped(std::move(reader));
    CHECK(wrapped.CachedView(0, 0, 4096) == nullptr);  // a wrapper may change reads: no bypass
  }  // the reader and its mapping are gone: the pages it touched can be dropped now
  if (OnTmpfs("/var/tmp")) return;  // nothing to drop there
  DropFromCache(path);
  auto cold = OpenOrSkip({path}, Options(backend));
  CHECK(cold->CachedView(0, 0, size) == nullptr);  // cold: to be read
}

TEST_CASE("reader: on tmpfs every read goes through the page cache") {
  if (!OnTmpfs("/dev/shm")) {
    WARN("skipped: /dev/shm is not a tmpfs here");
    return;
  }
  ScratchDir dir("/dev/shm");
  REQUIRE(dir.ok());
  const std::string path = dir.Path("shm.bin");
  WritePatternFile(path, 0, 1 << 20);
  auto reader = OpenOrSkip({path}, Options(ReaderBackend::kUring));
  if (!reader) return;
  AlignedBytes buffer(1 << 20);
  ReadRequest r{0, 0, 1 << 20, buffer.At(0), 7};
  reader->Submit({&r, 1});
  auto done = DrainAll(*reader, 1);
  REQUIRE(done[7].ok());
  CHECK(FirstMismatch(buffer.At(0), 0, 0, 1 << 20) == -1);
  CHECK(reader->stats().direct_bytes == 0);
  CHECK(reader->Describe().find("in-memory file system") != std::string::npos);
  CHECK_FALSE(reader->ReadsDirect(0, 0, 1 << 20));
}

TEST_CASE("reader: OpenReader logs its choice and names files it cannot open") {
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("o.bin");
  WritePatternFile(path, 0, 4096);
  std::string log;
  auto pread = OpenReader({path}, Options(ReaderBackend::kPread), &log);
  REQUIRE(pread.ok());
  CHECK(log.find("pread") != std::string::npos);
  CHECK(log.find("asked for") != std::string::npos);

  auto any = OpenReader({path}, Options(ReaderBackend::kAuto), &log);
  REQUIRE(any.ok());
  const Status probe = UringReader::Probe();
  INFO(log);
  if (probe.ok()) {
    CHECK(log.rfind("reader: io_uring", 0) == 0);
    CHECK(log.find("the probe created a ring") != std::string::npos);
  } else {
    CHECK(log.find("pread") != std::string::npos);
    CHECK(log.find("io_uring unavailable") != std::string::npos);
    auto uring = OpenReader({path}, Options(ReaderBackend::kUring));
    CHECK(uring.status().code() == StatusCode::kInvalidArgument);
  }

  auto missing = OpenReader({path, dir.Path("missing.bin")}, Options(ReaderBackend::kAuto));
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find("missing.bin") != std::string_view::npos);

  ReaderOptions bad;
  bad.queue_depth = 0;
  CHECK(OpenReader({path}, bad).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("reader: a ring that refuses submissions fails what it could not read and never hangs") {
  // The kernel stops taking entries after `after` calls: the reads it already took must land
  // intact, every other read fails with the reason and its offset, and the reader neither spins
  // nor hangs — not on the next Submit, not on Cancel, not on destruction.
  const uint64_t after = GENERATE(0, 1, 2, 3, 6);
  CAPTURE(after);
  ScratchDir dir(kTmp);
  REQUIRE(dir.ok());
  const std::string path = dir.Path("refused.bin");
  constexpr uint64_t kRead = 1 << 20;
  constexpr int kReads = 16;
  WritePatternFile(path, 0, kRead * kReads);
  DropFromCache(path);
  ReaderOptions options = Options(ReaderBackend::kUring);
  options.queue_depth = 4;
  options.max_chunk = 256 << 10;
  options.fail_submit_errno = EBADF;
  options.fail_submit_after = after;
  auto reader = OpenOrSkip({path}, options);
  if (!reader) return;

  AlignedBytes buffer(kRead * kReads);
  std::vector<ReadRequest> requests;
  for (int i = 0; i < kReads; ++i) {
    // Half in phase (O_DIRECT into the buffer), half off by 100 bytes (through bounce slots).
    const uint64_t misalign = i % 2 == 0 ? 0 : 100;
    requests.push_back({0, i * kRead + misalign, kRead - misalign,
                        buffer.At(0) + i * kRead + misalign, static_cast<uint64_t>(i)});
  }
  reader->Submit(requests);
  auto done = DrainAll(*reader, requests.size(), std::chrono::seconds(30));
  int failed = 0;
  for (const ReadRequest& r : requests) {
    const Status& status = done[r.tag];
    if (status.ok()) {
      CHECK(FirstMismatch(r.dst, 0, r.offset, r.length) == -1);
      continue;
    }
    ++failed;
    INFO(status.ToString());
    CHECK(status.code() == StatusCode::kIOError);
    CHECK(status.message().find("io_uring refused a submission") != std::string_view::npos);
    CHECK(status.message().find(std::strerror(EBADF)) != std::string_view::npos);
    CHECK(status.message().find(fmt::format("at offset {} of '{}'", r.offset, path)) !=
          std::string_view::npos);
  }
  CHECK(failed > 0);
  CHECK(reader->pending() == 0);

  // Broken for good: a new read fails at once with the same reason.
  std::vector<std::byte> one(4096);
  const ReadRequest late{0, 0, one.size(), one.data(), 100};
  reader->Submit({&late, 1});
  auto later = DrainAll(*reader, 1, std::chrono::seconds(10));
  CHECK(later[100].code() == StatusCode::kIOError);
  reader->Cancel();
  reader.reset();  // returns: nothing left in the kernel's hands
}

}  // namespace
}  // namespace loadstone::io
