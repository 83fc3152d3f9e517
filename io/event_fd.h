// EventFd: an owned eventfd (non-blocking, close-on-exec) — a counter whose descriptor is
// readable while it is non-zero. Used to hand "something is waiting" across threads.
//
// Thread safety: Signal and Reset may be called from any thread, concurrently.
#ifndef LOADSTONE_IO_EVENT_FD_H_
#define LOADSTONE_IO_EVENT_FD_H_

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "io/posix_error.h"
#include "loadstone/status.h"

namespace loadstone::io {

class EventFd {
 public:
  // Errors: IOError (EMFILE and friends) naming the eventfd.
  static Result<EventFd> Create() {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return ErrnoStatus(errno, "cannot create", "eventfd");
    return EventFd(fd);
  }
  EventFd() = default;
  ~EventFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  EventFd(EventFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  EventFd& operator=(EventFd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;

  int fd() const { return fd_; }

  // Makes fd() readable.
  void Signal() const {
    uint64_t one = 1;
    while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  // Makes fd() not readable (until the next Signal).
  void Reset() const {
    uint64_t count;
    while (::read(fd_, &count, sizeof count) < 0 && errno == EINTR) {
    }
  }

 private:
  explicit EventFd(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_EVENT_FD_H_
