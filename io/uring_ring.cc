#include "io/uring_ring.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "io/read_state.h"

namespace loadstone::io {
namespace {

constexpr uint64_t kBounceSlotMax = 4ULL << 20;  // a bounce slot at most

}  // namespace

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

namespace {

// Creates `ring` with `entries` entries: single-issuer with deferred task running, else (kernels
// before 6.1) plain, *kind saying which. Returns what Ring::Init returned (< 0: -errno).
int InitRing(Ring& ring, unsigned entries, const char** kind) {
  *kind = "single-issuer ring";
  int r = ring.Init(entries, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (r == -EINVAL) {  // kernels before 6.1
    *kind = "plain ring";
    r = ring.Init(entries, 0);
  }
  return r;
}

// Registers each file, then its O_DIRECT twin (or the file again), as fixed files; says how
// that went, for the description.
std::string RegisterFiles(Ring& ring, const std::vector<File>& files,
                          const std::vector<DirectTwin>& twins, RingSetup* setup) {
  std::vector<int> fds;
  for (const File& f : files) fds.push_back(f.fd());
  for (size_t i = 0; i < files.size(); ++i) {
    fds.push_back(twins[i].align > 0 ? twins[i].file.fd() : files[i].fd());
  }
  std::string file_note = "files registered";
  if (!fds.empty()) {
    const int r = io_uring_register_files(ring.get(), fds.data(), static_cast<unsigned>(fds.size()));
    setup->files_registered = r == 0;
    if (r < 0) file_note = fmt::format("files not registered: {}", std::strerror(-r));
  }
  return file_note;
}

// With O_DIRECT on and some twin open: the bounce pool (options.bounce_bytes in slots of up to
// kBounceSlotMax, aligned for every twin), registered as one fixed buffer where the kernel lets
// us. Says what O_DIRECT has, for the description.
std::string SetUpDirect(Ring& ring, const std::vector<File>& files,
                        const std::vector<DirectTwin>& twins, const ReaderOptions& options,
                        RingSetup* setup) {
  size_t direct_files = 0;
  uint64_t align = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    direct_files += twins[i].align > 0;
    align = std::max(align, twins[i].align);
  }
  if (!options.direct) return "page cache only (O_DIRECT off)";
  if (direct_files == 0) {
    return fmt::format("page cache only ({})", twins.empty() ? "no files" : twins.front().why_not);
  }
  std::string direct_note = fmt::format("O_DIRECT ready on {}/{} files", direct_files, files.size());
  const uint64_t pool_align = std::max<uint64_t>(align, 4096);
  const uint64_t slot =
      std::max(pool_align, std::min(options.max_chunk, kBounceSlotMax) / pool_align * pool_align);
  BouncePool& pool = setup->pool;
  if (options.bounce_bytes >= slot)
    pool = BouncePool(options.bounce_bytes / slot, slot, pool_align);
  if (!pool.empty()) {
    iovec iov{pool.data(), pool.total_bytes()};
    const int r = io_uring_register_buffers(ring.get(), &iov, 1);
    setup->buffers_registered = r == 0;
    direct_note += fmt::format(", bounce {} x {} KiB ({})", pool.count(), pool.slot_bytes() >> 10,
                               r == 0 ? std::string("registered")
                                      : fmt::format("not registered: {}", std::strerror(-r)));
  } else if (options.bounce_bytes > 0) {
    direct_note += ", no bounce buffers (out of memory)";
  }
  return direct_note;
}

}  // namespace

Result<RingSetup> SetUpRing(Ring& ring, const std::vector<File>& files,
                            const std::vector<DirectTwin>& twins, const ReaderOptions& options) {
  const unsigned entries = static_cast<unsigned>(options.queue_depth) + 1;  // + the wake poll
  if (options.fail_submit_errno != 0) {  // testing
    ring.RefuseAfter(options.fail_submit_after, options.fail_submit_errno);
  }
  const char* kind = nullptr;
  if (const int r = InitRing(ring, entries, &kind); r < 0) {
    return Status::Unsupported(RingError(-r));
  }
  RingSetup setup;
  const std::string file_note = RegisterFiles(ring, files, twins, &setup);
  const std::string direct_note = SetUpDirect(ring, files, twins, options, &setup);
  setup.description =
      fmt::format("io_uring ({} deep, {} MiB chunks{}, {}, {}, {})", options.queue_depth,
                  options.max_chunk >> 20, InFlightNote(options), direct_note, file_note, kind);
  return setup;
}

}  // namespace loadstone::io
