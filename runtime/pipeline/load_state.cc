#include "runtime/pipeline/load_state.h"

#include <asio/post.hpp>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "runtime/plan/check_plan.h"

namespace loadstone {
namespace {

// "cpu", then "cuda:0" to "cuda:{count - 1}": LoadNames::devices.
std::vector<std::string> DeviceNames(size_t count) {
  std::vector<std::string> out = {"cpu"};
  for (size_t i = 0; i < count; ++i) out.push_back(fmt::format("cuda:{}", i));
  return out;
}

}  // namespace

LoadHandle::State::State(asio::io_context& loop_in, asio::thread_pool& workers_in,
                         Checkpoint checkpoint_in, LoadPlan plan_in, LoadOptions options_in,
                         const LoaderOptions& loader_options_in, device::DeviceSet devices_in,
                         std::string device_log_in)
    : loop(loop_in),
      workers(workers_in),
      checkpoint(std::move(checkpoint_in)),
      plan(std::move(plan_in)),
      plan_error(planning::CheckPlanFor(checkpoint, plan)),
      options(std::move(options_in)),
      loader_options(loader_options_in),
      devices(std::move(devices_in)),
      device_log(std::move(device_log_in)),
      tensor_names(std::make_shared<const LoadNames>(LoadNames{checkpoint, DeviceNames(devices.size())})),
      // Unless the plan passed, Start() fails the load: its indices are not used.
      tensors(checkpoint, plan, plan_error.ok()),
      done(done_promise.get_future().share()),
      trace(options.trace),
      callbacks(plan.tensors.size()),
      hooks_(loader_options.hooks ? *loader_options.hooks : LoadHooks{}),
      workers_count_(loader_options.worker_threads > 0
                         ? static_cast<size_t>(loader_options.worker_threads)
                         : std::max(1u, std::thread::hardware_concurrency())),
      destinations_(checkpoint, plan, devices, options.host_memory_limit, loader_options.direct_io,
                    options.destination),
      read_(Context(), loader_options, hooks_, options.hub_cache),
      placement_(Context(), read_, devices) {
  if (options.on_tensor) callbacks.Add(options.on_tensor);
  if (options.on_progress) {  // after each tensor, with the progress then (this State outlives it)
    callbacks.Add([this](const loadstone::Tensor&) { options.on_progress(Snapshot()); },
                  pipeline::Callbacks::Kind::kOnProgress);
  }
}

Progress LoadHandle::State::Snapshot() const {
  Progress p;
  p.bytes_total = plan.read_bytes;
  p.bytes_read = read_.bytes_read();
  p.bytes_to_place = plan.placed_bytes;
  p.bytes_placed = tensors.bytes_placed();
  p.tensors_total = tensors.size();
  p.tensors_done = tensors.tensors_done();
  const double seconds = final_seconds.load();
  p.seconds = seconds >= 0 ? seconds
                           : std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  p.read_gbps = p.seconds > 0 ? p.bytes_read / p.seconds / 1e9 : 0;
  if (p.bytes_read > 0 && p.bytes_read < p.bytes_total) {
    p.eta_seconds = p.seconds * (p.bytes_total - p.bytes_read) / p.bytes_read;
  }
  return p;
}

pipeline::StageContext LoadHandle::State::Context() {
  return {*this,   loop,    workers, workers_count_, checkpoint,
          plan,    tensors, destinations_, trace};
}

void LoadHandle::State::OnLoop(std::function<void()> event) {
  asio::post(loop, [self = shared_from_this(), event = std::move(event)] {
    event();
    self->Schedule();
  });
}

void LoadHandle::State::Note(std::string_view note) {
  std::lock_guard lock(callbacks_mu);
  backend_description += "; ";
  backend_description += note;
}

void LoadHandle::State::Advance(uint32_t index, uint64_t source_bytes) {
  if (!tensors.Place(index, source_bytes)) return;
  const TensorPlan& tp = plan.tensors[index];
  const TensorInfo& src = checkpoint.tensors()[tp.source];
  placement_.Placed(index);
  std::shared_ptr<const loadstone::Tensor::HostCopier> copier;
  const int device = destinations_.DeviceOf(index);
  if (device >= 0) {
    copier = std::make_shared<const loadstone::Tensor::HostCopier>(
        [device = devices[device], data = tensors.data(index),
         bytes = tp.nbytes](std::span<std::byte> dst) {
          return device->CopyToHost(data, bytes, dst.data());
        });
  }
  tensors.Resolve(index, TensorAccess::Make(tensor_names, src, static_cast<size_t>(device + 1),
                                            tp.dtype, tensors.buffer(index), tensors.data(index),
                                            tp.nbytes, std::move(copier), Unpacks(tp.conversion)));
  placement_.Resolved(index);
  trace.Instant(fmt::format("ready {}", src.name), "tensor");
  callbacks.Deliver(index, tensors.future(index));
}

void LoadHandle::State::AdvanceChunk(uint64_t id) {
  const ReadChunk& chunk = plan.reads[id];
  for (uint32_t t : chunk.tensors) {
    if (destinations_.DeviceOf(t) >= 0) continue;  // a device piece: its job's completion counts it
    const auto [lo, hi] = pipeline::PieceOf(chunk, checkpoint.tensors()[plan.tensors[t].source]);
    Advance(t, hi - lo);
  }
}

void LoadHandle::State::Fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
  stopping_ = true;
  read_.Cancel();
}

void LoadHandle::State::RequestCancel() {
  OnLoop([this] {
    if (!finished) {
      Fail(Status::Cancelled("the load was cancelled"));
    } else {
      read_.Cancel();  // the Hub cache being completed on a worker stops (nothing, once closed)
    }
  });
}

void LoadHandle::State::RequestPriority(std::vector<uint64_t> ids) {
  OnLoop([this, ids = std::move(ids)] {
    if (!finished && !stopping_) read_.Prioritize(ids);
  });
}

void LoadHandle::State::Schedule() {
  if (finished) return;
  if (!stopping_) read_.Pump();
  MaybeFinish();
}

void LoadHandle::State::CancelIfAskedAt(LoadStage stage) {
  if (hooks_.cancel_at && hooks_.cancel_at(stage)) RequestCancel();
}

void LoadHandle::State::MaybeFinish() {
  if (finished || !read_.idle() || !placement_.idle()) return;
  if (!stopping_ && !tensors.all_done()) return;
  finished = true;  // no event acts from here on: Schedule and cancels return at once
  if (error_.ok() && tensors.all_done() && read_.caching()) {
    // Completing the Hub cache fetches and syncs: on a worker, so that the loop goes on serving
    // the Loader's other loads; the load ends back on the loop.
    trace.Instant("completing the cache", "load");
    asio::post(workers, [self = shared_from_this()] {
      const LoadHooks& hooks = self->hooks_;
      // As LoadHandle::Cancel from another thread now would: the reader stops what follows.
      if (hooks.cancel_at && hooks.cancel_at(LoadStage::kCompletingCache)) self->read_.Cancel();
      asio::post(self->loop, [self, cache = self->read_.FinishCache()]() mutable {
        self->Conclude(std::move(cache));
      });
    });
    return;
  }
  Conclude({});
}

void LoadHandle::State::Conclude(std::string cache) {
  final_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (auto stats = read_.Close(placement_.conversions_moved(), std::move(cache))) {  // ring, files
    std::lock_guard lock(callbacks_mu);
    read_stats = *stats;
  }
  destinations_.CloseFreshPages();  // every placed tensor is whole: unregisters their pages
  destinations_.CloseMappedFiles();
  Status result = error_;
  if (result.ok() && !tensors.all_done()) {
    result = Status::Corruption("the load ended with tensors not in place");  // a bug, never OK
  }
  if (!result.ok()) tensors.FailRest(result);
  read_.FreeStaging();
  trace.Instant(result.ok() ? "done" : "failed", "load");
  // Done() resolves after the load's last callback has returned (or failed the load).
  callbacks.Close(result, [self = shared_from_this()](Status status) {
    self->done_promise.set_value(std::move(status));
  });
}

}  // namespace loadstone
