// Starting a load, on the loop thread: the plan and the files checked, the reader opened, the
// planned devices resolved, each read's route for this load, fresh pages and the staging pool
// sized.
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "io/posix_error.h"
#include "runtime/pipeline/load_state.h"
#include "runtime/pipeline/routes.h"

namespace loadstone {
namespace {

io::ReaderBackend ToIo(ReadBackend backend) {
  switch (backend) {
    case ReadBackend::kUring: return io::ReaderBackend::kUring;
    case ReadBackend::kPread: return io::ReaderBackend::kPread;
    case ReadBackend::kAuto: break;
  }
  return io::ReaderBackend::kAuto;
}

}  // namespace

void LoadHandle::State::Start() {
  Begin();
  started_promise.set_value();  // backend() has its final text (or the load failed)
}

void LoadHandle::State::Begin() {
  trace.NameThread("event loop");
  if (!plan_error_.ok()) return Fail(plan_error_);
  // Files that changed since Open are found before any byte is read or mapped from them.
  for (uint32_t f = 0; f < checkpoint.files().size(); ++f) {
    if (Status s = CheckFileSize(f, 0); !s.ok()) return Fail(s);
  }
  // A callback that throws fails the load (the Loader is alive: it waits for Done()).
  callbacks.OnFailure([weak = weak_from_this()](Status status) {
    if (auto self = weak.lock()) {
      asio::post(self->loop, [self, status = std::move(status)] {
        if (!self->finished) self->Fail(status);
      });
    }
  });
  if (Status s = OpenReader(); !s.ok()) return Fail(s);

  if (plan.routes.mmap) {
    if (Status s = MapFiles(); !s.ok()) return Fail(s);
  }
  if (Status s = ResolveDevices(); !s.ok()) return Fail(s);
  OpenFreshPages();
  RouteChunks();
  SizeStaging();

  for (uint32_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].remaining == 0 && !tensors[i].done) {
      if (Status s = EnsureDestination(i); !s.ok()) return Fail(s);
      Advance(i, 0);
    }
  }
  ArmCompletions();
  Pump();
  MaybeFinish();
}

void LoadHandle::State::RouteChunks() {
  const pipeline::StartFacts facts{fresh_ != nullptr, loader_options.direct_io};
  chunks_.resize(plan.reads.size());
  staged_only_.assign(tensors.size(), true);
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    chunks_[i].route = pipeline::RouteAtStart(plan.reads[i].route, plan.routes, facts);
    if (chunks_[i].route != ReadRoute::kStaged) {
      for (uint32_t t : plan.reads[i].tensors) staged_only_[t] = false;
    }
  }
}

void LoadHandle::State::SizeStaging() {
  // A staged read lands at its file offset's phase within the slot (see EnsureDestination);
  // slots are as large as the largest read that may be staged.
  uint64_t largest = 0;
  for (size_t i = 0; i < plan.reads.size(); ++i) {
    const ReadRoute route = chunks_[i].route;
    if (route != ReadRoute::kInPlace && route != ReadRoute::kMapped) {
      largest = std::max(largest, plan.reads[i].length);
    }
  }
  slot_bytes_ = largest + 2 * pipeline::kHostAlignment;  // whole pages around any phase
  uint64_t pool = loader_options.staging_bytes;
  // A CPU load keeps its staging within a tenth of what it places, so that peak memory stays
  // near the model's size (a GPU load's host memory is its staging, whatever the model).
  if (!staging_device_) pool = std::min<uint64_t>(pool, plan.placed_bytes / 10);
  const size_t slots = std::max<uint64_t>(2, pool / slot_bytes_);
  staging_.resize(slots);
  // Device staging (pinned) is allocated on first use; host staging is prepared by the workers.
  auto& initial = staging_device_ ? free_slots_ : unprepared_slots_;
  for (size_t i = slots; i > 0; --i) initial.push_back(i - 1);
}

Status LoadHandle::State::OpenReader() {
  std::vector<std::string> paths;
  for (const CheckpointFile& f : checkpoint.files()) paths.push_back(f.path);
  io::ReaderOptions ro;
  ro.backend = ToIo(loader_options.backend);
  ro.queue_depth = loader_options.queue_depth;
  ro.direct = loader_options.direct_io;
  // ro.max_chunk stays the reader's default: it splits the plan's reads into the pieces the
  // kernel handles best (io/reader.h).
  // Every read this executor issues lands in phase with its file offset (staging slots and
  // whole pages; in-place buffers allocated at the offset's phase, EnsureDestination) unless
  // tensors must be 64-byte aligned: only then do O_DIRECT reads need bounce buffers. Without
  // them the reader keeps no pool (measured: 0 bounced bytes cold and warm, and 32 MiB of pinned
  // memory less); a read that is not in phase after all goes through the page cache, and
  // ReadStats says so (buffered_bytes).
  if (!plan.routes.align_tensors) ro.bounce_bytes = 0;
  std::string log;
  auto reader = reader_factory_ ? reader_factory_(paths, ro, &log) : io::OpenReader(paths, ro, &log);
  if (!reader.ok()) return reader.status();
  reader_ = std::move(*reader);
  {
    std::lock_guard lock(callbacks_mu);
    backend_description = reader_->Describe();
  }
  const int fd = ::dup(reader_->completion_fd());
  if (fd < 0) return io::ErrnoStatus(errno, "cannot watch the reader's completions of", paths[0]);
  completion_fd_ = std::make_unique<asio::posix::stream_descriptor>(loop, fd);

  return Status::OK();
}

Status LoadHandle::State::ResolveDevices() {
  target_device_.assign(plan.targets.size(), -1);
  for (size_t d = 0; d < plan.targets.size(); ++d) {
    const Device& target = plan.targets[d];
    if (target == Device::Cpu()) continue;
    if (target.is_gpu() && target.index >= 0 && target.index < static_cast<int>(devices.size())) {
      target_device_[d] = target.index;
      if (!staging_device_) staging_device_ = devices[target.index];
      continue;
    }
    const auto first = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                                    [&](const TensorPlan& t) { return t.device == d; });
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is planned on {}, but {}; plan for the devices this machine has "
        "(--device-map cpu, or auto without --max-memory for GPUs)",
        first == plan.tensors.end() ? std::string("?") : checkpoint.tensors()[first->source].name,
        target.ToString(),
        devices.empty() ? fmt::format("the Loader has no GPU ({})", device_log)
                        : fmt::format("this machine has {} GPU(s), cuda:0 to cuda:{}",
                                      devices.size(), devices.size() - 1)));
  }
  return Status::OK();
}

}  // namespace loadstone
