// io::CopyFromMapping: exact copies at every alignment and size, a mapping that lost its pages
// (the file shrank) caught as an IOError naming the page's offset — as many times as it happens,
// on any thread — and every other SIGBUS left to whoever had it before: the handler installed
// earlier (a child process run for that) or the default action (the process dies).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "io/mapped_copy.h"
#include "io/reader_test_util.h"
#include "testing/temp_dir.h"

namespace loadstone::io {
namespace {

// A file of `size` pattern bytes, mapped read-only and shared (as Reader::CachedView maps).
struct MappedFile {
  MappedFile(const std::string& at, uint64_t bytes) : path(at), size(bytes) {
    testing::WritePatternFile(path, 0, size);
    fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    data = static_cast<const std::byte*>(m);
  }
  ~MappedFile() {
    ::munmap(const_cast<std::byte*>(data), size);
    ::close(fd);
  }
  void Shrink(uint64_t to) const { std::filesystem::resize_file(path, to); }

  std::string path;
  uint64_t size;
  int fd = -1;
  const std::byte* data = nullptr;
};

constexpr uint64_t kPage = 4096;

}  // namespace

TEST_CASE("mapped copy: exact at every alignment and size, small and streamed", "[io]") {
  REQUIRE(PrepareMappedCopy().ok());
  loadstone::testing::TempDir dir;
  MappedFile file(dir.path() + "/f.bin", 3 << 20);
  std::vector<std::byte> out((3 << 20) + 64);
  std::mt19937_64 rng(7);
  // Sizes around the streaming threshold (256 KiB) and the 64-byte steps, heads at every phase.
  const std::vector<uint64_t> sizes = {0, 1, 31, 63, 64, 65, 4095, (256 << 10) - 1, 256 << 10,
                                       (256 << 10) + 33, (1 << 20) + 17, (3 << 20) - 200};
  for (uint64_t n : sizes) {
    for (int trial = 0; trial < 4; ++trial) {
      const uint64_t src = rng() % (file.size - n + 1);
      const uint64_t dst = rng() % 64;
      INFO("n " << n << " src " << src << " dst phase " << dst);
      std::fill(out.begin(), out.end(), std::byte{0xEE});
      REQUIRE(CopyFromMapping(out.data() + dst, file.data + src, n, src).ok());
      CHECK(testing::FirstMismatch(out.data() + dst, 0, src, n) == -1);
      // Nothing written around it.
      const auto untouched = [](std::byte b) { return b == std::byte{0xEE}; };
      CHECK(std::all_of(out.begin(), out.begin() + static_cast<ptrdiff_t>(dst), untouched));
      CHECK(std::all_of(out.begin() + static_cast<ptrdiff_t>(dst + n), out.end(), untouched));
    }
  }
}

TEST_CASE("mapped copy: pages past a shrunk file's end are an IOError naming the page, again and again",
          "[io]") {
  REQUIRE(PrepareMappedCopy().ok());
  loadstone::testing::TempDir dir;
  MappedFile file(dir.path() + "/f.bin", 1 << 20);
  file.Shrink(256 << 10);
  std::vector<std::byte> out(1 << 20);
  // Three times on this thread (the jump restores the signal mask: a blocked SIGBUS would kill
  // the process on the second fault), then on another thread.
  for (int round = 0; round < 3; ++round) {
    const Status s = CopyFromMapping(out.data(), file.data, 1 << 20, 1000 << 10);
    REQUIRE(s.code() == StatusCode::kIOError);
    // The first lost page is the file's page 64; the message counts from file_offset.
    CHECK_THAT(std::string(s.message()),
               Catch::Contains(std::to_string((1000 << 10) + (256 << 10))));
    CHECK_THAT(std::string(s.message()), Catch::Contains("shrank"));
    // What is still there copies.
    REQUIRE(CopyFromMapping(out.data(), file.data, 256 << 10, 0).ok());
    CHECK(testing::FirstMismatch(out.data(), 0, 0, 256 << 10) == -1);
  }
  Status other;
  std::thread([&] { other = CopyFromMapping(out.data(), file.data + (512 << 10), kPage, 0); }).join();
  CHECK(other.code() == StatusCode::kIOError);
}

TEST_CASE("mapped copy: a SIGBUS outside a guarded copy still takes the default action", "[io]") {
  REQUIRE(PrepareMappedCopy().ok());
  loadstone::testing::TempDir dir;
  MappedFile file(dir.path() + "/f.bin", 1 << 20);
  file.Shrink(kPage);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    volatile std::byte b = file.data[512 << 10];  // past the end, no guard: SIGBUS
    (void)b;
    ::_exit(0);  // survived: the handler swallowed a fault that was not its own
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (A sanitizer's own SIGBUS handler, there before ours, reports and exits instead.)
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGBUS);
#endif
}

namespace {
void ForeignHandler(int, siginfo_t*, void*) { ::_exit(42); }
}  // namespace

// Run only in a child process (below): a handler installed before loadstone's gets the faults
// that are not loadstone's, and guarded copies still work beside it.
TEST_CASE("sigbus child: a foreign SIGBUS reaches the handler installed before ours", "[.][io]") {
  struct sigaction foreign {};
  foreign.sa_sigaction = &ForeignHandler;
  foreign.sa_flags = SA_SIGINFO;
  sigemptyset(&foreign.sa_mask);
  REQUIRE(::sigaction(SIGBUS, &foreign, nullptr) == 0);
  REQUIRE(PrepareMappedCopy().ok());
  loadstone::testing::TempDir dir;
  MappedFile file(dir.path() + "/f.bin", 1 << 20);
  file.Shrink(kPage);
  std::vector<std::byte> out(kPage);
  if (CopyFromMapping(out.data(), file.data + (512 << 10), kPage, 0).code() != StatusCode::kIOError) {
    ::_exit(3);
  }
  volatile std::byte b = file.data[512 << 10];
  (void)b;
  ::_exit(4);
}

TEST_CASE("mapped copy: a foreign SIGBUS goes to the handler installed before ours", "[io]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A fresh process, so that this handler is installed before loadstone's.
    ::execl("/proc/self/exe", "mapped_copy_child",
            "sigbus child: a foreign SIGBUS reaches the handler installed before ours",
            static_cast<char*>(nullptr));
    ::_exit(5);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 42);
}

TEST_CASE("mapped copy: a handler that replaced ours turns the guard off, and says so", "[io]") {
  REQUIRE(PrepareMappedCopy().ok());
  struct sigaction ours {}, other {};
  other.sa_handler = SIG_DFL;
  sigemptyset(&other.sa_mask);
  REQUIRE(::sigaction(SIGBUS, &other, &ours) == 0);
  const Status s = PrepareMappedCopy();
  REQUIRE(::sigaction(SIGBUS, &ours, nullptr) == 0);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(s.message()), Catch::Contains("replaced"));
  CHECK(PrepareMappedCopy().ok());
}

}  // namespace loadstone::io
