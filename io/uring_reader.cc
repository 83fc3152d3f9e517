#include "io/uring_reader.h"

#include <liburing.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/direct_io.h"
#include "io/event_fd.h"
#include "io/read_state.h"
#include "io/uring_ring.h"

namespace loadstone::io {
namespace {

constexpr uint64_t kInlineCopyMax = 1 << 20;
constexpr unsigned kCqeBatch = 64;

}  // namespace

struct UringReader::Impl {
  void Run();  // the ring thread: sets up the ring, then serves it
  bool TakeInbox();
  void Fill();
  std::unique_ptr<ReadPiece> CutNext();
  void Prep(io_uring_sqe* sqe, ReadPiece& piece);
  void ArmWake();
  void Drain();
  void Handle(ReadPiece* raw, int res);
  void Retire(std::unique_ptr<ReadPiece> piece);
  void Break(int err);
  void FailWaiting();
  // Fails every read not yet fully handed to the kernel with why(request).
  template <typename Why>
  void FailQueued(Why why);
  void WaitBroken();
  Status Abandoned(const ReadRequest& r) const;

  std::vector<File> files;
  std::vector<DirectTwin> twins;
  std::vector<CacheProbe> caches;
  std::unique_ptr<std::atomic<bool>[]> direct_ok;  // per file: O_DIRECT open and not refused
  ReaderOptions options;
  std::unique_ptr<CompletionQueue> completions;
  StatCounters stats;
  std::unique_ptr<EagainStorm> storm;  // options.eagain_every (testing)
  EventFd wake;                             // Submit and Cancel → the ring thread
  std::promise<Status> ready;               // the ring's set-up, for Create()
  std::atomic<uint64_t> direct_refused{0};  // O_DIRECT reads the kernel refused (EINVAL)

  std::mutex mu;
  std::vector<std::shared_ptr<PendingRead>> inbox;  // guarded by mu
  bool cancelled = false;                           // guarded by mu
  bool stopping = false;                            // guarded by mu

  // Ring thread only, but for `setup.description`: read by others after `ready`.
  RingSetup setup;
  std::deque<std::shared_ptr<PendingRead>> queue;  // not fully scheduled, in order
  std::deque<std::unique_ptr<ReadPiece>> retry;    // to resubmit (short read, EAGAIN, ...)
  unsigned in_flight = 0;                          // pieces prepared and not yet back
  // Set when the kernel refused a submission for good: every read not in the kernel fails
  // with it, and the ring is only waited on, never submitted to again.
  Status broken;
  std::vector<ReadCompletion> done;
  Ring ring;  // after `setup`: torn down before the bounce pool it may have registered

  std::thread thread;
};

Status UringReader::Probe() { return ProbeRing(); }

Result<std::unique_ptr<UringReader>> UringReader::Create(std::vector<File> files,
                                                         const ReaderOptions& options) {
  LOADSTONE_RETURN_IF_ERROR(CheckOptions(options));
  auto impl = std::make_unique<Impl>();
  LOADSTONE_ASSIGN_OR_RETURN(impl->completions, CompletionQueue::Create());
  LOADSTONE_ASSIGN_OR_RETURN(impl->wake, EventFd::Create());
  impl->options = options;
  impl->storm = std::make_unique<EagainStorm>(options.eagain_every);
  impl->files = std::move(files);
  for (const File& f : impl->files) {
    DisableReadahead(f);
    impl->twins.push_back(options.direct ? OpenDirectTwin(f) : DirectTwin{});
    impl->caches.emplace_back(f);
  }
  impl->direct_ok = std::make_unique<std::atomic<bool>[]>(impl->files.size());
  for (size_t i = 0; i < impl->files.size(); ++i) impl->direct_ok[i] = impl->twins[i].align > 0;
  std::future<Status> started = impl->ready.get_future();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  Status status = started.get();
  if (!status.ok()) {
    impl->thread.join();
    return status;
  }
  return std::unique_ptr<UringReader>(new UringReader(std::move(impl)));
}

UringReader::UringReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UringReader::~UringReader() {
  Cancel();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.Signal();
  impl_->thread.join();
}

void UringReader::Impl::Run() {
  Result<RingSetup> made = SetUpRing(ring, files, twins, options);
  if (made.ok()) setup = std::move(made).value();
  ready.set_value(made.status());
  if (!made.ok()) return;
  ArmWake();
  for (;;) {
    const bool stop = TakeInbox();
    if (broken.ok()) {
      Fill();
    } else {
      FailWaiting();
    }
    completions->Push(&done);
    if (stop && in_flight == 0 && retry.empty() && queue.empty()) break;
    if (!broken.ok()) {
      WaitBroken();
      continue;
    }
    const int r = ring.Submit(1);
    if (r == -EAGAIN) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // kernel memory
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) Break(-r);
    Drain();
  }
}

// A healthy ring only refuses a submission for a moment (EAGAIN, EBUSY, EINTR). Anything else
// (EBADF, EFAULT, ENOMEM, ...) would repeat forever: the reads the kernel never saw fail now —
// their buffers were never handed to it, so they are free to go — and the pieces it did take
// are waited for, so that no DMA outlives its completion.
void UringReader::Impl::Break(int err) {
  broken = Status::IOError(fmt::format(
      "io_uring refused a submission: {} (errno {}); reads not yet in the kernel were abandoned. "
      "A new reader may work; `--backend pread` avoids io_uring",
      std::strerror(err), err));
  for (void* data : ring.TakeUnsubmitted()) {  // they stay in the queue, never submitted
    if (data == nullptr) continue;               // the wake-up poll
    std::unique_ptr<ReadPiece> piece(static_cast<ReadPiece*>(data));
    --in_flight;
    piece->read->Fail(Abandoned(piece->read->request));
    Retire(std::move(piece));
  }
  FailWaiting();
}

template <typename Why>
void UringReader::Impl::FailQueued(Why why) {
  for (const std::shared_ptr<PendingRead>& read : queue) {
    read->Fail(why(read->request));  // its pieces in the kernel, if any, still complete it
    if (read->TakeCompletion()) done.push_back({read->request.tag, read->status});
  }
  queue.clear();
}

void UringReader::Impl::FailWaiting() {
  FailQueued([this](const ReadRequest& r) { return Abandoned(r); });
  while (!retry.empty()) {
    std::unique_ptr<ReadPiece> piece = std::move(retry.front());
    retry.pop_front();
    piece->read->Fail(Abandoned(piece->read->request));
    Retire(std::move(piece));
  }
}

Status UringReader::Impl::Abandoned(const ReadRequest& r) const {
  return Status::IOError(fmt::format("read of {} bytes at offset {} of '{}' not done: {}",
                                     r.length, r.offset, files[r.file].path(), broken.message()));
}

// Broken: waits for the kernel's pieces without submitting anything, then for the next
// Submit, Cancel or destruction on the wake-up eventfd itself.
void UringReader::Impl::WaitBroken() {
  if (in_flight > 0) {
    ring.WaitWithoutSubmitting();  // the stranded entries stay unseen
    Drain();
    return;
  }
  pollfd pfd{wake.fd(), POLLIN, 0};
  if (::poll(&pfd, 1, -1) > 0) wake.Reset();
}

void UringReader::Impl::ArmWake() {
  io_uring_sqe* sqe = ring.GetSqe();  // in_flight ≤ queue_depth leaves one entry for this
  if (sqe == nullptr) return;
  io_uring_prep_poll_add(sqe, wake.fd(), POLLIN);
  ring.Queued(sqe, nullptr);
}

bool UringReader::Impl::TakeInbox() {
  std::vector<std::shared_ptr<PendingRead>> incoming;
  bool cancel, stop;
  {
    std::lock_guard<std::mutex> lock(mu);
    incoming.swap(inbox);
    cancel = cancelled;
    stop = stopping;
  }
  for (std::shared_ptr<PendingRead>& read : incoming) queue.push_back(std::move(read));
  if (cancel) {
    FailQueued([this](const ReadRequest& r) { return CancelledError(files[r.file].path(), r); });
  }
  return stop;
}

void UringReader::Impl::Fill() {
  while (in_flight < static_cast<unsigned>(options.queue_depth)) {
    std::unique_ptr<ReadPiece> piece;
    if (!retry.empty()) {
      piece = std::move(retry.front());
      retry.pop_front();
      if (piece->read->stopped()) {
        Retire(std::move(piece));
        continue;
      }
    } else {
      piece = CutNext();
      if (!piece) break;
    }
    io_uring_sqe* sqe = ring.GetSqe();
    if (sqe == nullptr) {
      retry.push_front(std::move(piece));
      break;
    }
    Prep(sqe, *piece);
    ring.Queued(sqe, piece.release());  // reclaimed in Handle() or Break()
    ++in_flight;
  }
}

std::unique_ptr<ReadPiece> UringReader::Impl::CutNext() {
  while (!queue.empty() && queue.front()->fully_scheduled()) queue.pop_front();
  if (queue.empty()) return nullptr;
  std::shared_ptr<PendingRead> read = queue.front();
  const ReadRequest& r = read->request;
  const uint64_t offset = r.offset + read->scheduled;
  CutPolicy policy;
  policy.max_chunk = options.max_chunk;
  policy.align = twins[r.file].align;
  policy.bounce_slot = setup.pool.slot_bytes();
  PieceCut cut = CutPiece(offset, r.dst + read->scheduled, read->remaining(), policy);
  // Warm data is copied from the page cache (a device read would be slower); cold data goes
  // to the device with O_DIRECT where it can.
  const bool cached = caches[r.file].CachedFraction(offset, cut.length) >= kMostlyCached;
  if (cached) cut.kind = PieceKind::kBuffered;
  int slot = -1;
  if (cut.kind == PieceKind::kBounce && (slot = setup.pool.Acquire()) < 0) return nullptr;  // wait
  std::unique_ptr<ReadPiece> piece =
      TakePiece(read, cut, policy.align, slot, slot < 0 ? nullptr : setup.pool.slot(slot));
  piece->cached = cached;
  if (read->fully_scheduled()) queue.pop_front();
  return piece;
}

void UringReader::Impl::Prep(io_uring_sqe* sqe, ReadPiece& piece) {
  const uint32_t file = piece.read->request.file;
  const ReadCall call = NextCall(piece, twins[file].align, options.max_read_call);
  const bool direct = call.direct;
  const int index = static_cast<int>(direct ? files.size() + file : file);
  const int fd =
      setup.files_registered ? index : (direct ? twins[file].file.fd() : files[file].fd());
  const auto len = static_cast<unsigned>(call.length);
  if (piece.slot >= 0 && setup.buffers_registered) {
    io_uring_prep_read_fixed(sqe, fd, call.to, len, call.at, 0);
  } else {
    io_uring_prep_read(sqe, fd, call.to, len, call.at);
  }
  // Buffered reads go to io-wq workers, except small ones from the cache (copied inline): for
  // cold data the inline path retries page by page as the cache fills (slower, and costlier in
  // CPU), and big copies from the cache run in parallel there.
  unsigned flags = setup.files_registered ? IOSQE_FIXED_FILE : 0;
  if (!direct && (!piece.cached || call.length >= kInlineCopyMax)) flags |= IOSQE_ASYNC;
  io_uring_sqe_set_flags(sqe, flags);
  piece.direct_now = direct;
  piece.asked = call.length;
}

void UringReader::Impl::Drain() {
  io_uring_cqe* cqes[kCqeBatch];
  unsigned n;
  while ((n = io_uring_peek_batch_cqe(ring.get(), cqes, kCqeBatch)) > 0) {
    for (unsigned i = 0; i < n; ++i) {
      Handle(static_cast<ReadPiece*>(io_uring_cqe_get_data(cqes[i])), cqes[i]->res);
    }
    io_uring_cq_advance(ring.get(), n);
  }
}

void UringReader::Impl::Handle(ReadPiece* raw, int res) {
  if (raw == nullptr) {  // the wake-up poll fired: reset the eventfd and watch it again
    wake.Reset();
    if (broken.ok()) ArmWake();
    return;
  }
  std::unique_ptr<ReadPiece> piece(raw);
  --in_flight;
  const uint32_t file = piece->read->request.file;
  if (res > 0 && storm->Hit()) res = -EAGAIN;  // testing: the bytes read are read again
  switch (ApplyReadResult(*piece, res, files[file], stats)) {
    case ReadOutcome::kRetryBuffered:  // the file system refused O_DIRECT after all
      twins[file].align = 0;
      direct_ok[file].store(false, std::memory_order_relaxed);
      direct_refused.fetch_add(1, std::memory_order_relaxed);
      [[fallthrough]];
    case ReadOutcome::kRetry:
      retry.push_back(std::move(piece));
      return;
    case ReadOutcome::kFinished:
      Retire(std::move(piece));
      return;
  }
}

void UringReader::Impl::Retire(std::unique_ptr<ReadPiece> piece) {
  if (piece->slot >= 0) setup.pool.Release(piece->slot);
  PendingRead& read = *piece->read;
  --read.in_flight;
  if (read.TakeCompletion()) {
    if (read.status.ok()) Add(stats.bytes, read.request.length);
    done.push_back({read.request.tag, read.status});
  }
}

std::string UringReader::Describe() const {
  uint64_t refused = impl_->direct_refused.load(std::memory_order_relaxed);
  if (refused == 0) return impl_->setup.description;
  return fmt::format("{} [{} O_DIRECT reads refused, redone buffered]", impl_->setup.description,
                     refused);
}

void UringReader::Submit(std::span<const ReadRequest> requests) {
  Impl& d = *impl_;
  std::vector<std::shared_ptr<PendingRead>> accepted =
      Admit(requests, d.files.size(), *d.completions, d.stats);
  if (accepted.empty()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.cancelled) {
      for (const auto& read : accepted) {
        d.completions->Push(read->request.tag,
                            CancelledError(d.files[read->request.file].path(), read->request));
      }
      return;
    }
    wake = d.inbox.empty();  // otherwise a wake-up is already on its way
    d.inbox.insert(d.inbox.end(), accepted.begin(), accepted.end());
  }
  if (wake) d.wake.Signal();
}

size_t UringReader::Reap(std::vector<ReadCompletion>* out) { return impl_->completions->Reap(out); }

int UringReader::completion_fd() const { return impl_->completions->fd(); }

size_t UringReader::pending() const { return impl_->completions->outstanding(); }

void UringReader::Cancel() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->cancelled) return;
    impl_->cancelled = true;
  }
  impl_->wake.Signal();
}

ReaderStats UringReader::stats() const { return impl_->stats.Snapshot(); }

bool UringReader::ReadsDirect(uint32_t file, uint64_t offset, uint64_t length) const {
  return file < impl_->files.size() && impl_->direct_ok[file].load(std::memory_order_relaxed) &&
         impl_->caches[file].CachedFraction(offset, length) < kMostlyCached;
}

Result<uint64_t> UringReader::SizeNow(uint32_t file) const {
  if (file >= impl_->files.size()) return Status::InvalidArgument("no such file in the reader");
  return impl_->files[file].SizeNow();
}

const std::byte* UringReader::CachedView(uint32_t file, uint64_t offset, uint64_t length) const {
  return file < impl_->caches.size() ? impl_->caches[file].CachedView(offset, length) : nullptr;
}

}  // namespace loadstone::io
