#include "io/pread_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "io/completion_queue.h"
#include "io/direct_io.h"
#include "io/posix_error.h"
#include "io/read_state.h"

namespace loadstone::io {

struct PreadReader::Impl {
  void Work();
  Status ReadPiece(const File& file, const ReadRequest& r, uint64_t start, uint64_t length);

  std::vector<File> files;
  std::vector<CacheProbe> caches;  // one per file
  ReaderOptions options;
  std::unique_ptr<CompletionQueue> completions;
  StatCounters stats;
  std::unique_ptr<EagainStorm> storm;  // options.eagain_every (testing)

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<PendingRead>> queue;  // not fully scheduled; guarded by mu
  bool cancelled = false;                          // guarded by mu
  bool stopping = false;                           // guarded by mu
  uint64_t bytes_in_flight = 0;                    // pieces being read; guarded by mu
  std::vector<std::thread> threads;
};

Result<std::unique_ptr<PreadReader>> PreadReader::Create(std::vector<File> files,
                                                         const ReaderOptions& options) {
  LOADSTONE_RETURN_IF_ERROR(CheckOptions(options));
  auto impl = std::make_unique<Impl>();
  LOADSTONE_ASSIGN_OR_RETURN(impl->completions, CompletionQueue::Create());
  impl->files = std::move(files);
  for (const File& f : impl->files) {
    DisableReadahead(f);
    impl->caches.emplace_back(f);
  }
  impl->options = options;
  impl->storm = std::make_unique<EagainStorm>(options.eagain_every);
  Impl* raw = impl.get();
  // The reader owns impl before any thread starts, so a failed start still joins the others.
  std::unique_ptr<PreadReader> reader(new PreadReader(std::move(impl)));
  for (int i = 0; i < options.threads; ++i) raw->threads.emplace_back([raw] { raw->Work(); });
  return reader;
}

PreadReader::PreadReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PreadReader::~PreadReader() {
  Cancel();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  for (std::thread& t : impl_->threads) t.join();
}

Result<uint64_t> PreadReader::SizeNow(uint32_t file) const {
  if (file >= impl_->files.size()) return Status::InvalidArgument("no such file in the reader");
  return impl_->files[file].SizeNow();
}

const std::byte* PreadReader::CachedView(uint32_t file, uint64_t offset, uint64_t length) const {
  return file < impl_->caches.size() ? impl_->caches[file].CachedView(offset, length) : nullptr;
}

std::string PreadReader::Describe() const {
  const ReaderOptions& o = impl_->options;
  return fmt::format("pread ({} threads, {} MiB chunks{}, page cache)", o.threads,
                     o.max_chunk >> 20, InFlightNote(o));
}

void PreadReader::Submit(std::span<const ReadRequest> requests) {
  Impl& d = *impl_;
  std::vector<std::shared_ptr<PendingRead>> accepted =
      Admit(requests, d.files.size(), *d.completions, d.stats);
  if (accepted.empty()) return;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (std::shared_ptr<PendingRead>& read : accepted) {
      if (d.cancelled) {
        d.completions->Push(read->request.tag,
                            CancelledError(d.files[read->request.file].path(), read->request));
      } else {
        d.queue.push_back(std::move(read));
      }
    }
  }
  d.cv.notify_all();
}

void PreadReader::Impl::Work() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    // A piece (at most max_chunk) only if it fits under the bound, or alone.
    const uint64_t cap = options.max_bytes_in_flight;
    cv.wait(lock, [&] {
      return stopping || (!queue.empty() && (cap == 0 || bytes_in_flight == 0 ||
                                             bytes_in_flight + options.max_chunk <= cap));
    });
    if (queue.empty()) return;
    std::shared_ptr<PendingRead> read = queue.front();
    const uint64_t start = read->scheduled;
    const uint64_t length = std::min(read->remaining(), options.max_chunk);
    read->scheduled += length;
    ++read->in_flight;
    bytes_in_flight += length;
    RaisePeak(stats.peak_bytes_in_flight, bytes_in_flight);
    if (read->fully_scheduled()) queue.pop_front();
    if (!queue.empty()) cv.notify_one();  // more pieces for another thread

    lock.unlock();
    Status status = ReadPiece(files[read->request.file], read->request, start, length);
    lock.lock();

    if (!status.ok()) {
      read->Fail(std::move(status));
      // A failed request schedules nothing more; drop it if it is still queued.
      auto it = std::find(queue.begin(), queue.end(), read);
      if (it != queue.end()) queue.erase(it);
    }
    --read->in_flight;
    bytes_in_flight -= length;
    if (cap != 0 && !queue.empty()) cv.notify_one();  // room for a piece a thread waits with
    if (read->TakeCompletion()) {
      if (read->status.ok()) Add(stats.bytes, read->request.length);
      completions->Push(read->request.tag, read->status);
    }
  }
}

Status PreadReader::Impl::ReadPiece(const File& file, const ReadRequest& r, uint64_t start,
                                    uint64_t length) {
  uint64_t done = 0;
  while (done < length) {
    uint64_t ask = length - done;
    if (options.max_read_call > 0) ask = std::min(ask, options.max_read_call);
    const uint64_t at = r.offset + start + done;
    ssize_t n = -1;
    if (storm->Hit()) {
      errno = EAGAIN;
    } else {
      n = ::pread(file.fd(), r.dst + start + done, ask, static_cast<off_t>(at));
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        Add(stats.resubmits, 1);
        continue;
      }
      return ErrnoStatus(errno, fmt::format("read {} bytes at offset {} of", ask, at), file.path());
    }
    if (n == 0) return TruncatedError(file, r, at);
    done += static_cast<uint64_t>(n);
    Add(stats.buffered_bytes, static_cast<uint64_t>(n));
    if (done < length) Add(stats.resubmits, 1);
  }
  return Status::OK();
}

size_t PreadReader::Reap(std::vector<ReadCompletion>* out) { return impl_->completions->Reap(out); }

int PreadReader::completion_fd() const { return impl_->completions->fd(); }

size_t PreadReader::pending() const { return impl_->completions->outstanding(); }

void PreadReader::Cancel() {
  Impl& d = *impl_;
  std::lock_guard<std::mutex> lock(d.mu);
  d.cancelled = true;
  for (const std::shared_ptr<PendingRead>& read : d.queue) {
    read->Fail(CancelledError(d.files[read->request.file].path(), read->request));
    if (read->TakeCompletion()) d.completions->Push(read->request.tag, read->status);
  }
  d.queue.clear();
}

ReaderStats PreadReader::stats() const { return impl_->stats.Snapshot(); }

}  // namespace loadstone::io
