// The ring thread of a UringReader: takes the reads submitted, cuts them into pieces, keeps at
// most options.queue_depth of them (and options.max_bytes_in_flight bytes) in the kernel,
// drains completions in batches, retries short and refused reads, and posts what finished to
// the completion queue.
#include <liburing.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "io/uring_reader_impl.h"

namespace loadstone::io {
namespace {

constexpr uint64_t kInlineCopyMax = 1 << 20;
constexpr unsigned kCqeBatch = 64;

}  // namespace

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
      // A piece is at most max_chunk: cut one only if that fits under the bound, or alone.
      const uint64_t cap = options.max_bytes_in_flight;
      if (cap != 0 && in_flight > 0 && bytes_in_flight + options.max_chunk > cap) break;
      piece = CutNext();
      if (!piece) break;
      bytes_in_flight += piece->bytes;  // until Retire, retries included
      RaisePeak(stats.peak_bytes_in_flight, bytes_in_flight);
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
  bytes_in_flight -= piece->bytes;
  PendingRead& read = *piece->read;
  --read.in_flight;
  if (read.TakeCompletion()) {
    if (read.status.ok()) Add(stats.bytes, read.request.length);
    done.push_back({read.request.tag, read.status});
  }
}

}  // namespace loadstone::io
