// One load: its two stages, the events between them and the one scheduler. The read stage
// (read_stage.h) is the only code that issues reads: the read window, each read's record and
// route, the staging pool, the page-cache copies. The placement stage (placement_stage.h) turns a
// staged read into placed tensors on the workers and the devices, with the scale and quant-state
// dependencies. The load itself keeps the rest: the tensors (tensor_slots.h: futures, memory,
// bytes still to come), the destinations (destinations.h: every tensor's memory), the callbacks
// (callbacks.h), the progress, the first error, and the one finish rule. The stages see the load
// through LoadLink (load_link.h); every event enters through OnLoop (or, for the reader's
// completions and Start, ends the same way) and ends in Schedule, the one scheduler: it issues
// what reads there is room for (ReadStage::Pump) and applies the finish rule (MaybeFinish).
// Everything except the atomics, the futures and the callback list runs on the Loader's
// event-loop thread (the io_context), so it needs no lock.
#ifndef LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_
#define LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "io/reader.h"
#include "loadstone/loader.h"
#include "runtime/device/accelerator.h"
#include "runtime/pipeline/callbacks.h"
#include "runtime/pipeline/destinations.h"
#include "runtime/pipeline/tensor_access.h"
#include "runtime/pipeline/tensor_slots.h"
#include "runtime/device/platform_impl.h"
#include "runtime/pipeline/load_hooks.h"
#include "runtime/pipeline/load_link.h"
#include "runtime/pipeline/placement_stage.h"
#include "runtime/pipeline/read_stage.h"
#include "runtime/pipeline/trace.h"

namespace loadstone {

// Defined here so that the pipeline can reach it; the public header only names it.
namespace pipeline {
// What a LoadHandle that holds no load answers: InvalidArgument.
Status NoLoad();
}  // namespace pipeline

struct LoadHandle::State : std::enable_shared_from_this<LoadHandle::State>,
                           private pipeline::LoadLink {
  // Set when this State is gone — after the loop, the workers and the callbacks let go of it and
  // every member (the tensors' buffers included) is destroyed: declared first, so destroyed
  // last. ~LoadHandle waits on it.
  struct ReleasedSignal {
    std::shared_ptr<std::promise<void>> promise = std::make_shared<std::promise<void>>();
    ~ReleasedSignal() { promise->set_value(); }
  };
  const ReleasedSignal released;

  using TensorCallback = std::function<void(const loadstone::Tensor&)>;

  State(asio::io_context& loop, asio::thread_pool& workers, Checkpoint checkpoint, LoadPlan plan,
        LoadOptions options, const LoaderOptions& loader_options, device::DeviceSet devices,
        std::string device_log);


  // Called once, on the loop thread: opens the reader and starts reading.
  void Start();
  void Begin();  // Start() but for the `started` signal
  // Thread-safe: posts a cancel to the loop.
  void RequestCancel();
  // Thread-safe: Done() has resolved (until then a cancel may still stop something: the reads,
  // or the Hub cache being completed after them).
  bool ended() const { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  // Thread-safe: posts to the loop that reads `ids` (ascending) go next (ReadWindow::Prioritize).
  void RequestPriority(std::vector<uint64_t> ids);
  // Thread-safe: RequestCancel when the platform's test hook asks for it at `stage`.
  void CancelIfAskedAt(LoadStage stage) override;
  // Thread-safe: the progress now (LoadHandle::progress).
  Progress Snapshot() const;

  // --- read-only after construction ---
  asio::io_context& loop;
  asio::thread_pool& workers;
  const Checkpoint checkpoint;
  const LoadPlan plan;
  // planning::CheckPlanFor's verdict (a plan is used only with the checkpoint it was made for,
  // and only when it can be carried out as it is), acted on by Start().
  const Status plan_error;
  const LoadOptions options;
  const LoaderOptions loader_options;
  const device::DeviceSet devices;  // "cuda:N" = devices[N]
  const std::string device_log;
  // The names the tensors handed out point into ("cpu" is device 0, "cuda:N" is N + 1).
  const std::shared_ptr<const LoadNames> tensor_names;

  // Per planned tensor: its future, its memory, its bytes not yet in place (tensor_slots.h).
  pipeline::TensorSlots tensors;

  std::promise<Status> done_promise;
  std::shared_future<Status> done;
  // Set once Start() has opened the reader (or failed): backend() waits for it.
  std::promise<void> started_promise;
  std::shared_future<void> started = started_promise.get_future().share();

  // --- progress, readable from any thread (bytes read: the read stage's; placed bytes and
  // tensors done: `tensors`) ---
  std::atomic<bool> finished{false};
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::atomic<double> final_seconds{-1};  // set when finished
  pipeline::TraceRecorder trace;
  std::string backend_description;  // set before the first read; guarded by callbacks_mu
  ReadStats read_stats;              // set when finished; guarded by callbacks_mu

  mutable std::mutex callbacks_mu;  // guards backend_description and read_stats
  pipeline::Callbacks callbacks;    // the load's callbacks, on its own callback thread

 private:
  // The stages' link to the load (load_link.h). Every event of a load — a read's completion, a
  // worker's or a device's result, a staging slot prepared, a cancel, a callback's failure —
  // enters through OnLoop (or, for the reader's completions and Start, calls Schedule at its end
  // the same way), so that the stages only record what happened and one scheduler decides what
  // runs next.
  void OnLoop(std::function<void()> event) override;
  std::shared_ptr<const void> Hold() override { return shared_from_this(); }
  void Fail(Status status) override;
  bool stopping() const override { return stopping_; }
  void Advance(uint32_t tensor, uint64_t source_bytes) override;
  void AdvanceChunk(uint64_t id) override;  // every CPU tensor of the read by its piece of it
  void Staged(uint64_t id) override { placement_.OnStaged(id); }
  void Note(std::string_view note) override;

  pipeline::StageContext Context();
  // The scheduler, at the end of every event: issues the reads there is room for
  // (ReadStage::Pump), then finishes the load when nothing is left in flight (MaybeFinish). The
  // only caller of both.
  void Schedule();
  // Waits for the reader's completions, which the read stage hands on, then Schedule.
  void ArmCompletions();
  // Begin()'s step after the reader: the destinations (devices, maps, fresh pages), with their
  // notes for the backend line.
  Status OpenDestinations();
  // The one finish rule: nothing of either stage in flight, and every tensor in place or the
  // load stopping. Then Conclude, at once or after the Hub cache is completed on a worker.
  void MaybeFinish();
  // The load's end, on the loop: the reader closed (its figures, with what the cache said), the
  // destinations closed, the tensors not in place failed, Done resolved after the callbacks.
  void Conclude(std::string cache);

  const LoadHooks hooks_;     // LoaderOptions::hooks (testing)
  const size_t workers_count_;  // threads in `workers`
  pipeline::Destinations destinations_;
  pipeline::ReadStage read_;
  pipeline::PlacementStage placement_;
  bool stopping_ = false;
  Status error_;
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_
