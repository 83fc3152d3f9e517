// Helpers for the Reader tests: pattern files, aligned buffers, draining a reader with a
// deadline (a hang fails the test instead of stalling it), and a seed that is printed.
#ifndef LOADSTONE_TESTS_IO_READER_TEST_UTIL_H_
#define LOADSTONE_TESTS_IO_READER_TEST_UTIL_H_

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/reader.h"
#include "testing/temp_dir.h"

namespace loadstone::io::testing {

// The byte at `offset` of pattern file `file`: no two nearby offsets or files agree for long.
inline std::byte PatternByte(uint32_t file, uint64_t offset) {
  uint64_t x = (offset + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t{file} + 1) * 0xC2B2AE3D27D4EB4FULL;
  x ^= x >> 29;
  return static_cast<std::byte>(x ^ (x >> 8));
}

inline void WritePatternFile(const std::string& path, uint32_t file, uint64_t size) {
  std::vector<char> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(PatternByte(file, i));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
}

// Writes back and drops `path` from the page cache, so that reads go to the device.
inline void DropFromCache(const std::string& path) {
  REQUIRE(loadstone::testing::DropFromPageCache(path));
}

// Index of the first byte of dst[0, length) that differs from the pattern, or -1.
// Keeps a file's pages in the page cache while it lives: a shared read-only mapping of it,
// mlock'ed (the kernel evicts no locked page, even in a memory cgroup at its limit). Where
// mlock is refused (RLIMIT_MEMLOCK) the pages may be evicted under memory pressure, and
// AllResident() tells whether they were.
class CachePin {
 public:
  explicit CachePin(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        map_ = map;
        size_ = static_cast<size_t>(st.st_size);
        pinned_ = ::mlock(map_, size_) == 0;
      }
    }
    ::close(fd);
  }
  ~CachePin() {
    if (map_ != nullptr) ::munmap(map_, size_);  // unlocks as well
  }
  CachePin(const CachePin&) = delete;
  CachePin& operator=(const CachePin&) = delete;

  bool pinned() const { return pinned_; }

  // Every page of the file is in the page cache now (mincore).
  bool AllResident() const {
    if (map_ == nullptr) return false;
    std::vector<unsigned char> pages((size_ + 4095) / 4096);
    if (::mincore(map_, size_, pages.data()) != 0) return false;
    return std::all_of(pages.begin(), pages.end(), [](unsigned char v) { return v & 1; });
  }

 private:
  void* map_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

inline int64_t FirstMismatch(const std::byte* dst, uint32_t file, uint64_t offset,
                             uint64_t length) {
  for (uint64_t i = 0; i < length; ++i) {
    if (dst[i] != PatternByte(file, offset + i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// A folder under `base`, removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& base) {
    std::string pattern = base + "/loadstone-reader-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  bool ok() const { return !path_.empty(); }
  std::string Path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline bool OnTmpfs(const std::string& path) {
  struct statfs fs;
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == 0x01021994;  // TMPFS_MAGIC
}

// Page-aligned bytes; `At(k)` is an address k bytes past a 4096 boundary.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t size) : size_(size + 4096) {
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, (size_ + 4095) / 4096 * 4096)));
  }
  std::byte* At(size_t misalign) const { return data_.get() + misalign; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  size_t size_;
  std::unique_ptr<std::byte, Free> data_;
};

// Reaps until `expected` completions arrived (every tag must come once), or fails after
// `deadline`. Returns them by tag.
inline std::map<uint64_t, Status> DrainAll(
    Reader& reader, size_t expected, std::chrono::seconds deadline = std::chrono::seconds(60)) {
  std::map<uint64_t, Status> by_tag;
  std::vector<ReadCompletion> batch;
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (by_tag.size() < expected) {
    pollfd pfd{reader.completion_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    batch.clear();
    reader.Reap(&batch);
    for (ReadCompletion& c : batch) {
      INFO("tag " << c.tag);
      REQUIRE(by_tag.count(c.tag) == 0);  // exactly once
      by_tag.emplace(c.tag, std::move(c.status));
    }
    if (std::chrono::steady_clock::now() > end) {
      FAIL("reader hung: " << by_tag.size() << " of " << expected << " completions after "
                           << deadline.count() << " s; pending " << reader.pending());
    }
  }
  return by_tag;
}

// Submits `requests` (of pattern files: request.file is the pattern's file number), waits for
// them all and requires each to be OK and byte-exact.
inline void ReadAllExact(Reader& reader, const std::vector<ReadRequest>& requests) {
  reader.Submit(requests);
  auto done = DrainAll(reader, requests.size());
  for (const ReadRequest& r : requests) {
    INFO("request " << r.tag << " " << done[r.tag].ToString());
    REQUIRE(done[r.tag].ok());
    REQUIRE(FirstMismatch(r.dst, r.file, r.offset, r.length) == -1);
  }
}

// Catch's --rng-seed when given, otherwise a fresh one; printed either way.
inline uint64_t TestSeed(const char* test) {
  uint64_t seed = Catch::rngSeed();
  if (seed == 0) seed = std::random_device{}();
  std::printf("%s: seed %llu (rerun with --rng-seed %llu)\n", test,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

inline ReaderOptions Options(ReaderBackend backend) {
  ReaderOptions o;
  o.backend = backend;
  return o;
}

inline const char* Name(ReaderBackend b) {
  return b == ReaderBackend::kUring ? "uring" : b == ReaderBackend::kPread ? "pread" : "auto";
}

// Opens a reader on `paths` with `options`; for kUring on a machine without io_uring, returns
// nullptr after saying why the test is skipped.
inline std::unique_ptr<Reader> OpenOrSkip(const std::vector<std::string>& paths,
                                          const ReaderOptions& options) {
  auto reader = OpenReader(paths, options);
  if (!reader.ok() && options.backend == ReaderBackend::kUring &&
      reader.status().code() == StatusCode::kInvalidArgument) {
    WARN("skipped (io_uring unavailable): " << reader.status().ToString());
    return nullptr;
  }
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  return std::move(reader).value();
}

}  // namespace loadstone::io::testing

#endif  // LOADSTONE_TESTS_IO_READER_TEST_UTIL_H_
