// One load: its stages, the events between them and the one scheduler. The stages each own one
// thing: the tensors (tensor_slots.h: futures, memory, bytes still to come, progress), the reads'
// records (chunk_table.h: each read's route, slot and parts), the read window (read_window.h: the
// only code that submits reads), the staging pool (staging_pool.h: each slot held by one chunk,
// TakeStagingSlot .. ReleaseSlot), the destinations (destinations.h: every tensor's memory), the
// placer (placer.h: CPU conversions and device jobs), the quant states on devices
// (device_quant.h) and the callbacks (callbacks.h). Every event enters through OnLoop (or, for
// the reader's completions and Start, ends the same way) and ends in Schedule, the one scheduler:
// it issues what reads there is room for (Pump, reads.cc) and applies the one finish rule
// (MaybeFinish). staged.cc hands staged bytes to the workers and devices; the work they have in
// flight is counted per kind (WorkInFlight). Everything except the atomics, the futures and the
// callback list runs on the Loader's event-loop thread (the io_context), so it needs no lock.
#ifndef LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_
#define LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <array>
#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/reader.h"
#include "loadstone/loader.h"
#include "runtime/device/accelerator.h"
#include "runtime/pipeline/callbacks.h"
#include "runtime/pipeline/chunk_table.h"
#include "runtime/pipeline/destinations.h"
#include "runtime/pipeline/device_quant.h"
#include "runtime/pipeline/host_buffer.h"
#include "runtime/pipeline/placer.h"
#include "runtime/pipeline/read_window.h"
#include "runtime/pipeline/staging_pool.h"
#include "runtime/pipeline/tensor_access.h"
#include "runtime/pipeline/tensor_slots.h"
#include "runtime/device/platform_impl.h"
#include "runtime/pipeline/load_hooks.h"
#include "runtime/pipeline/trace.h"

namespace loadstone {

// Defined here so that the pipeline can reach it; the public header only names it.
struct LoadHandle::State : std::enable_shared_from_this<LoadHandle::State> {
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
  // Thread-safe: RequestCancel when the platform's test hook asks for it at `stage`.
  void CancelIfAskedAt(LoadStage stage);
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

  // --- progress, readable from any thread ---
  std::atomic<uint64_t> bytes_read{0};  // placed bytes and tensors done: `tensors`
  std::atomic<bool> finished{false};
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::atomic<double> final_seconds{-1};  // set when finished
  pipeline::TraceRecorder trace;
  std::string backend_description;  // set before the first read; guarded by callbacks_mu
  ReadStats read_stats;              // set when finished; guarded by callbacks_mu

  mutable std::mutex callbacks_mu;  // guards backend_description and read_stats
  pipeline::Callbacks callbacks;    // the load's callbacks, on its own callback thread

 private:
  // Runs `event(*this)` on the loop thread, then Schedule(). Every event of a load — a read's
  // completion, a worker's or a device's result, a staging slot prepared, a cancel, a
  // callback's failure — enters through here (or, for the reader's completions and Start, calls
  // Schedule at its end the same way), so that the stages only record what happened and one
  // scheduler decides what runs next.
  template <typename Event>
  void OnLoop(Event&& event) {
    asio::post(loop, [self = shared_from_this(), event = std::forward<Event>(event)]() mutable {
      event(*self);
      self->Schedule();
    });
  }
  // The scheduler, at the end of every event: issues the reads there is room for (Pump), then
  // finishes the load when nothing is left in flight (MaybeFinish). The only caller of both.
  void Schedule();
  void Pump();
  // Takes a free staging slot (allocating it on first use) for chunk `id` and points `request`
  // at the whole pages around the chunk, in it. Needs a free slot.
  Status TakeStagingSlot(uint64_t id, io::ReadRequest* request);
  void ArmCompletions();
  void OnCompletions();
  void OnReadDone(uint64_t chunk, Status status);
  // Hands a staged chunk's pieces to the workers and devices.
  void DispatchStaged(uint64_t chunk);
  // Submits tensor `t`'s device piece of staged chunk `chunk` (`file_bytes` of its file), counted
  // as one part of the chunk by the caller; `keep` holds the bytes the job copies from when they
  // are not the staging slot's (a relayout's output).
  void SubmitDevicePiece(uint64_t chunk, uint32_t t, device::PlaceJob job,
                         uint64_t file_bytes, std::shared_ptr<std::vector<std::byte>> keep);
  // A device piece the CPU prepares first, on a worker, then SubmitDevicePiece (conversion site
  // kCpuThenDevice): a strided or big-endian tensor's relayout, or a quantized weight's decode.
  void PrepareForDevice(uint64_t chunk, size_t slot, uint32_t t);
  void ConvertStaged(uint64_t chunk, size_t slot);  // runs on a worker thread
  // ConvertStaged's pieces of an unshared chunk, staged at `staged`: each CPU tensor's, converted
  // as planned (Placer::PlaceOnCpu). Runs on a worker thread.
  Status PlaceCpuPieces(uint64_t chunk, const std::byte* staged);
  void OnStagedDone(uint64_t chunk, Status status);
  void OnDevicePieceDone(uint64_t chunk, uint32_t tensor, uint64_t bytes, Status status);
  void ChunkPartDone(uint64_t chunk);  // frees the chunk's slot after its last part
  // Gives chunk `id`'s staging slot back to the pool: the one place a slot is released, once
  // (the chunk holds the slot's index until then).
  void ReleaseSlot(uint64_t id);
  // Host staging: workers allocate the slots staging_ hands out, and first-touch them when
  // `touch` (a read that fills most of a slot would otherwise fault it in on the ring thread,
  // with O_DIRECT).
  void PrepareSlots(bool touch);
  void OnSlotPrepared(size_t slot, Result<std::shared_ptr<std::byte>> buffer);
  void SizeStaging();
  // Begin()'s steps: the reader and its completion eventfd; the destinations (devices, maps,
  // fresh pages), with their notes for the backend line.
  Status OpenReader();
  Status OpenDestinations();
  // Each chunk's route for this load (RouteAtStart).
  void RouteChunks();
  // Each tensor's conversion site for this load (SiteAtStart), with its departures counted and
  // named on the backend line.
  void SiteConversions();
  // The index into `devices` of tensor `t`'s device, -1 for the CPU.
  int DeviceOf(uint32_t t) const { return destinations_.DeviceOf(t); }
  // The memory of tensor `t`'s scales (float8 scales, a bitsandbytes absmax) when it is
  // dequantized with them, else null.
  const std::byte* ScalesOf(uint32_t t) const {
    const TensorPlan& tp = plan.tensors[t];
    return UsesScales(tp.conversion) ? tensors.data(tp.scale) : nullptr;
  }
  // Quantized weight `t`'s quant state on its device, for a device that decodes
  // (ConversionSite::kDevice; device_quant.h), its upload counted as work in flight.
  Result<std::shared_ptr<const device::QuantDecode>> DeviceQuant(uint32_t t);
  // Where an unstaged read lands: its (first) tensor's memory at the read's offset in it — the
  // read's own tensor, or the start of its shared buffer.
  std::byte* ReadDestination(uint64_t id) const {
    const ReadChunk& chunk = plan.reads[id];
    const uint32_t t = chunk.tensors.front();
    return tensors.data(t) + (chunk.offset - checkpoint.tensors()[plan.tensors[t].source].offset);
  }
  // The staged bytes of chunk `id` in staging slot `slot` (at the file offset's phase).
  const std::byte* StagedBytes(uint64_t id, size_t slot) const {
    return staging_.data(slot) + plan.reads[id].offset % pipeline::kHostAlignment;
  }
  void CopyCached(uint64_t id, const std::byte* source);  // runs on a worker thread
  void OnCachedDone(uint64_t id, Status status);
  void Advance(uint32_t tensor, uint64_t source_bytes);
  void AdvanceChunk(uint64_t chunk);  // every CPU tensor of the chunk by its piece of it
  // Tensor `tensor`'s memory (destinations_), once; for a ReadChunk::shared_buffer chunk, the
  // one buffer its tensors point into.
  Status EnsureDestination(uint32_t tensor);
  Status EnsureSharedBuffer(uint64_t chunk);
  // Corruption naming the file and the first tensor past its end when file `file` no longer has
  // the size it had when the checkpoint was opened (`needed` == 0) or is shorter than `needed`:
  // the file the reader opened once it is open (not whatever its path names now), else the path.
  Status CheckFileSize(uint32_t file, uint64_t needed) const;
  // OK when mapped file `file` is, now, the file the catalog describes (Destinations::
  // CheckMapped); else Corruption naming it and, when its size changed, the first tensor past
  // its end.
  Status CheckMappedFile(uint32_t file) const;
  void Fail(Status status);
  void MaybeFinish();

  const LoadHooks hooks_;           // LoaderOptions::hooks (testing)
  bool first_read_back_ = false;    // LoadStage::kMidStream asked
  const size_t workers_count_;  // threads in `workers`
  pipeline::Destinations destinations_;
  const pipeline::Placer placer_;
  pipeline::ReadWindow window_;
  pipeline::StagingPool staging_;
  pipeline::ChunkTable chunks_;  // one record per plan.reads entry, and the routes taken
  // Per tensor: where its conversion runs in this load (SiteConversions).
  std::vector<ConversionSite> sites_;
  uint64_t conversions_moved_ = 0;  // ReadStats::conversions_moved
  // Staged chunks of float8 weights read before their scales were in place, by scale tensor.
  std::unordered_map<uint32_t, std::vector<uint64_t>> waiting_for_scales_;
  // Quantized weights' quant states on the devices that decode them (DeviceQuant).
  pipeline::DeviceQuantStates device_quant_;
  // Work under way outside the read window, by kind; MaybeFinish waits for all of it.
  struct WorkInFlight {
    size_t cpu_pieces = 0;     // a staged chunk's CPU part on a worker (ConvertStaged)
    size_t device_pieces = 0;  // a tensor's piece of a staged chunk, to OnDevicePieceDone
    size_t cached_copies = 0;  // page-cache copies on a worker (CopyCached)
    size_t quant_uploads = 0;  // quantized weights' quant state copied to their device
    bool idle() const {
      return cpu_pieces == 0 && device_pieces == 0 && cached_copies == 0 && quant_uploads == 0;
    }
  };
  WorkInFlight in_flight_;
  bool stopping_ = false;
  Status error_;
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_PIPELINE_LOAD_STATE_H_
