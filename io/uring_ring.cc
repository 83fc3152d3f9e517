#include "io/uring_ring.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>

#include <fmt/format.h>

namespace loadstone::io {

std::string RingError(int err) {
  std::string_view hint;
  if (err == ENOSYS) hint = " (this kernel has no io_uring)";
  if (err == EPERM || err == EACCES) hint = " (disabled: sysctl kernel.io_uring_disabled, seccomp)";
  if (err == ENOMEM) hint = " (not enough lockable memory: raise `ulimit -l`)";
  return fmt::format("cannot create an io_uring ring: {}{}", std::strerror(err), hint);
}

Status ProbeRing() {
  Ring ring;
  if (int r = ring.Init(4, 0); r < 0) return Status::Unsupported(RingError(-r));
  std::unique_ptr<io_uring_probe, void (*)(io_uring_probe*)> probe(
      io_uring_get_probe_ring(ring.get()), io_uring_free_probe);
  if (!probe || !io_uring_opcode_supported(probe.get(), IORING_OP_READ)) {
    return Status::Unsupported("this kernel's io_uring has no IORING_OP_READ (Linux 5.6+ needed)");
  }
  return Status::OK();
}

Ring::~Ring() {
  // Entries never taken are dropped with the ring: the kernel does not read them on exit.
  if (live_) io_uring_queue_exit(&ring_);
}

int Ring::Init(unsigned entries, unsigned flags) {
  io_uring_params params;
  std::memset(&params, 0, sizeof params);
  params.flags = flags;
  int r = io_uring_queue_init_params(entries, &ring_, &params);
  live_ = r == 0;
  return r;
}

io_uring_sqe* Ring::GetSqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe != nullptr) return sqe;
  Submit(0);  // the queue is full: flush it (an error shows in the caller's next Submit)
  return io_uring_get_sqe(&ring_);
}

void Ring::Queued(io_uring_sqe* sqe, void* data) {
  io_uring_sqe_set_data(sqe, data);
  unsubmitted_.push_back(data);
}

int Ring::Submit(unsigned wait_nr) {
  ++submit_calls_;
  int r;
  if (refuse_errno_ != 0 && submit_calls_ > refuse_after_) {
    r = -refuse_errno_;
  } else {
    r = wait_nr > 0 ? io_uring_submit_and_wait(&ring_, wait_nr) : io_uring_submit(&ring_);
  }
  const size_t taken = r > 0 ? std::min<size_t>(static_cast<size_t>(r), unsubmitted_.size()) : 0;
  unsubmitted_.erase(unsubmitted_.begin(), unsubmitted_.begin() + static_cast<ptrdiff_t>(taken));
  return r;
}

int Ring::WaitWithoutSubmitting() {
  io_uring_cqe* cqe = nullptr;
  return io_uring_wait_cqe(&ring_, &cqe);  // io_uring_enter with to_submit = 0
}

std::deque<void*> Ring::TakeUnsubmitted() {
  std::deque<void*> out;
  out.swap(unsubmitted_);
  return out;
}

}  // namespace loadstone::io
