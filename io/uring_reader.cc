#include "io/uring_reader.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "io/uring_reader_impl.h"

namespace loadstone::io {

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
