// InterruptToCancel: Ctrl-C asks for a cancel and leaves the program's output working.
#include "tools/loadstone/progress_bar.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace loadstone::cli {
namespace {

TEST_CASE("InterruptToCancel: a write that Ctrl-C interrupts goes on instead of failing",
          "[tools]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  // A full pipe: the next write blocks until the reader drains it.
  REQUIRE(::fcntl(fds[1], F_SETFL, O_NONBLOCK) == 0);
  const std::vector<char> chunk(4096, 'x');
  while (::write(fds[1], chunk.data(), chunk.size()) > 0) {
  }
  REQUIRE(::fcntl(fds[1], F_SETFL, 0) == 0);

  InterruptToCancel interrupt;
  ssize_t written = 0;
  int error = 0;
  std::thread writer([&] {
    written = ::write(fds[1], chunk.data(), chunk.size());
    error = errno;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // blocked in write by now
  REQUIRE(::pthread_kill(writer.native_handle(), SIGINT) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Room for the writer's bytes, whether or not its handler has run yet (a sanitizer may defer it
  // until the write returns): one read of at most the pipe's capacity.
  std::vector<char> sink(1 << 20);
  REQUIRE(::read(fds[0], sink.data(), sink.size()) > 0);
  writer.join();
  INFO("errno " << error);
  CHECK(written == static_cast<ssize_t>(chunk.size()));
  CHECK(interrupt.interrupted());
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace loadstone::cli
