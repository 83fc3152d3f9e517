// Starting a load, on the loop thread: the plan's verdict (CheckPlanFor, made when the load was
// made) acted on, the files checked, the reader opened, the planned devices resolved, each
// read's route and each tensor's conversion site for this load, fresh pages and the staging
// pool sized.
#include <asio/post.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "io/mapped_copy.h"
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
  Schedule();
  started_promise.set_value();  // backend() has its final text (or the load failed)
}

void LoadHandle::State::Begin() {
  trace.NameThread("event loop");
  if (!plan_error.ok()) return Fail(plan_error);
  // Files that changed since Open are found before any byte is read or mapped from them.
  for (uint32_t f = 0; f < checkpoint.files().size(); ++f) {
    if (Status s = CheckFileSize(f, 0); !s.ok()) return Fail(s);
  }
  // A callback that throws fails the load (the Loader is alive: it waits for Done()).
  callbacks.OnFailure([weak = weak_from_this()](Status status) {
    if (auto self = weak.lock()) {
      self->OnLoop([status = std::move(status)](State& state) {
        if (!state.finished) state.Fail(status);
      });
    }
  });
  if (Status s = OpenReader(); !s.ok()) return Fail(s);

  if (Status s = OpenDestinations(); !s.ok()) return Fail(s);
  RouteChunks();
  SiteConversions();
  SizeStaging();

  for (uint32_t i = 0; i < tensors.size(); ++i) {
    if (tensors.empty(i)) {
      if (Status s = EnsureDestination(i); !s.ok()) return Fail(s);
      Advance(i, 0);
    }
  }
  ArmCompletions();
  // On the loop itself: taken before the first read is issued, not after.
  if (hooks_.cancel_at && hooks_.cancel_at(LoadStage::kBeforeFirstRead)) {
    return Fail(Status::Cancelled("the load was cancelled"));
  }
}

void LoadHandle::State::RouteChunks() {
  const pipeline::StartFacts facts{destinations_.has_fresh_pages(), loader_options.direct_io};
  // Memory that exists before the load (the caller's; pinned, which pinning populated) is
  // filled from the page cache by the workers' streaming copy when the copy is guarded.
  const bool given = std::any_of(plan.tensors.begin(), plan.tensors.end(),
                                 [](const TensorPlan& tp) { return tp.memory_given(); });
  bool guarded = false;
  if (given) {
    const Status s = io::PrepareMappedCopy();
    guarded = s.ok();
    if (!guarded) {
      std::lock_guard lock(callbacks_mu);
      backend_description += fmt::format("; {}", s.message());
    }
  }
  chunks_.SettleAtStart(facts, guarded);
}

void LoadHandle::State::SiteConversions() {
  sites_.resize(plan.tensors.size());
  std::vector<uint64_t> moved(devices.size());
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorPlan& tp = plan.tensors[t];
    const int device = DeviceOf(t);
    const bool decodes = device >= 0 && devices[device]->DecodesQuantized();
    sites_[t] = pipeline::SiteAtStart(tp.conversion_site, tp.conversion, decodes);
    if (device >= 0 && sites_[t] != tp.conversion_site) ++moved[device];
  }
  for (size_t d = 0; d < moved.size(); ++d) {
    if (moved[d] == 0) continue;
    conversions_moved_ += moved[d];
    std::lock_guard lock(callbacks_mu);
    backend_description += fmt::format(
        "; cuda:{} has no kernels for quantized weights: {} planned for it decoded by the workers",
        d, moved[d]);
  }
}

void LoadHandle::State::SizeStaging() {
  // A staged read lands at its file offset's phase within the slot (see TakeStagingSlot);
  // slots are as large as the largest read that may be staged.
  const uint64_t slot_bytes = chunks_.LargestStaged() + 2 * pipeline::kHostAlignment;  // whole pages around any phase
  uint64_t pool = loader_options.staging_bytes;
  // A CPU load keeps its staging within a tenth of what it places, so that peak memory stays
  // near the model's size (a GPU load's host memory is its staging, whatever the model).
  const auto& device = destinations_.staging_device();
  if (!device) pool = std::min<uint64_t>(pool, plan.placed_bytes / 10);
  staging_.Reset(slot_bytes, std::max<uint64_t>(2, pool / slot_bytes), device);
}

Status LoadHandle::State::OpenReader() {
  std::vector<std::string> paths;
  for (const CheckpointFile& f : checkpoint.files()) paths.push_back(f.path);
  io::ReaderOptions ro;
  ro.backend = ToIo(loader_options.backend);
  ro.queue_depth = loader_options.queue_depth;
  ro.direct = loader_options.direct_io;
  ro.catalogued = checkpoint.files();
  // ro.max_chunk stays the reader's default: it splits the plan's reads into the pieces the
  // kernel handles best (io/reader.h).
  // Every read this executor issues lands in phase with its file offset (staging slots and
  // whole pages; in-place buffers allocated at the offset's phase, EnsureDestination) unless
  // tensors must be 64-byte aligned: only then do O_DIRECT reads need bounce buffers. Without
  // them the reader keeps no pool (no bounced bytes, and its pinned memory saved); a read that is not in phase after all goes through the page cache, and
  // ReadStats says so (buffered_bytes).
  if (!plan.routes.align_tensors) ro.bounce_bytes = 0;
  LOADSTONE_RETURN_IF_ERROR(window_.Open(loop, paths, ro, hooks_.open_reader));
  std::lock_guard lock(callbacks_mu);
  backend_description = window_.reader().Describe();
  return Status::OK();
}

Status LoadHandle::State::OpenDestinations() {
  LOADSTONE_RETURN_IF_ERROR(destinations_.Resolve(device_log));
  if (plan.routes.mmap) LOADSTONE_RETURN_IF_ERROR(destinations_.MapFiles());
  const bool refuse_fresh = hooks_.refuse_userfaultfd && hooks_.refuse_userfaultfd();
  for (const std::string& note :
       {destinations_.OpenFreshPages(refuse_fresh), destinations_.PinnedNote()}) {
    if (note.empty()) continue;
    std::lock_guard lock(callbacks_mu);
    backend_description += "; " + note;
  }
  return Status::OK();
}

}  // namespace loadstone
