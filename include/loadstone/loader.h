// Loader and LoadHandle: stream a planned checkpoint into memory, asynchronously.
//
//   loadstone::Loader loader;                       // long-lived; reuse it across loads
//   loadstone::LoadHandle load = loader.Load(*ckpt, *plan);   // returns at once
//   loadstone::Status s = load.OnTensor([&](const loadstone::Tensor& t) { engine.Bind(t.name(), t); });
//   const loadstone::Tensor& first = load.Tensor("model.layers.0.mlp.up_proj.weight").get();
//   loadstone::Status done = load.Done().get();    // all placed, or why not
//
// Nothing is reported loaded before every one of its bytes is in place. A failed load names the
// file, tensor and byte offset; a cancelled one reports Cancelled. Either way every buffer the
// load allocated and did not hand out is freed, and the Loader goes on working.
//
// Thread safety: Loader is thread-safe; several loads may run at once. A LoadHandle may be used
// from any thread.
//
// Callbacks (LoadOptions::on_tensor and on_progress, OnTensor, OnTensorReady, OnDone, and the
// completions of loadstone/asio.h) run on their load's own callback thread — never on the thread
// that does the I/O bookkeeping, never on a thread another load uses: one load's in completion
// order, one at a time. A callback that is slow or blocks (a full upload queue, a lock, another
// load's Done()) delays its own load's later callbacks and Done(), and no other load, however
// many loads are blocked. The thread is started when the load first has a callback to run and
// ends soon after its last; a load without callbacks has none. A callback may call back into its
// handle (OnTensor, OnTensorReady, OnDone, Tensor(name).get(), Cancel) but must not wait for its
// own load's Done(), which waits for it.
//
// A callback that throws fails its load with CallbackFailed (status.h) naming the callback, the
// tensor and the exception's message — none of the other codes fits: the caller's arguments
// were valid and the checkpoint is fine. A waiter that throws once the load's end is decided (an
// OnDone callback; an OnTensorReady callback told the load ended without its tensor) can no
// longer fail it: the exception is swallowed and counted, never written anywhere, and
// LoadHandle::late_callback_error() reports it.
//
// A handle may be destroyed inside one of its own callbacks (an engine that drops the handle
// when done): the load is cancelled if it had not finished, no on-tensor callback is called
// after that one, and the load is freed once its callback thread lets go — the destructor does
// not wait for it there.
#ifndef LOADSTONE_LOADER_H_
#define LOADSTONE_LOADER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/plan.h"
#include "loadstone/platform.h"
#include "loadstone/status.h"

namespace loadstone {

// A loaded tensor: a view of memory that it keeps alive. Copies share the memory (and, for a
// load's tensors, the name and shape, which stay in the checkpoint's catalog: a copy costs no
// allocation).
class Tensor {
 public:
  Tensor() = default;
  // A tensor over `data` (nbytes long, kept alive by `owner`) on `device` ("cpu" for host
  // memory; CopyToHost then copies with memcpy).
  Tensor(std::string name, DType dtype, std::vector<uint64_t> shape, std::string device,
         std::shared_ptr<void> owner, std::byte* data, uint64_t nbytes);

  const std::string& name() const { return *name_; }
  DType dtype() const { return dtype_; }
  const std::vector<uint64_t>& shape() const { return *shape_; }
  const std::string& device() const { return *device_; }  // "cpu", "cuda:0", ...
  // The memory, valid while any copy of this Tensor lives: host memory for "cpu" (page-aligned
  // when it has fresh pages of its own, see ReadRouteOptions::fill_fresh_pages; aligned to 64
  // bytes for converted tensors, small converted ones sharing 4 MiB blocks, and with
  // ReadRouteOptions::align_tensors; otherwise as the file aligns it — small unconverted
  // tensors share their read's buffer, ReadChunk::shared_buffer), a device address otherwise
  // (never dereference it on the host).
  const std::byte* data() const { return data_; }
  std::byte* mutable_data() const { return data_; }
  uint64_t nbytes() const { return nbytes_; }

  // Copies the bytes into `dst` (nbytes() long), from whichever device holds them. The check
  // path (CRCs, tests), not the fast path. Errors: InvalidArgument (size), the device's error.
  Status CopyToHost(std::span<std::byte> dst) const;

  using HostCopier = std::function<Status(std::span<std::byte>)>;

 private:
  friend struct TensorAccess;  // how the pipeline makes its tensors (runtime/pipeline/)

  inline static const std::string kNoName;
  inline static const std::vector<uint64_t> kNoShape;
  inline static const std::string kCpu = "cpu";

  std::shared_ptr<const void> names_owner_;  // keeps *name_, *shape_ and *device_ alive
  const std::string* name_ = &kNoName;
  const std::vector<uint64_t>* shape_ = &kNoShape;
  const std::string* device_ = &kCpu;
  DType dtype_ = DType::kF32;
  std::shared_ptr<void> owner_;
  std::byte* data_ = nullptr;
  uint64_t nbytes_ = 0;
  std::shared_ptr<const HostCopier> copier_;  // device tensors: how to copy them to the host
};

struct Progress {
  uint64_t bytes_total = 0;     // bytes to read (LoadPlan::read_bytes)
  uint64_t bytes_read = 0;      // read from storage (or copied from the page cache) so far
  uint64_t bytes_to_place = 0;  // bytes once loaded (LoadPlan::placed_bytes)
  // In place, converted where asked, so far: never more than bytes_to_place, and equal to it
  // once every tensor is in place (mapped tensors count when mapped).
  uint64_t bytes_placed = 0;
  size_t tensors_total = 0;
  size_t tensors_done = 0;
  double seconds = 0;         // since the load started
  double read_gbps = 0;       // bytes_read / seconds / 1e9
  double eta_seconds = 0;     // at the current rate; 0 when done
};

// What the reader did, known once the load is done: how the bytes came off storage.
struct ReadStats {
  uint64_t direct_bytes = 0;    // read from the device with O_DIRECT (page cache bypassed)
  uint64_t buffered_bytes = 0;  // read through the page cache (copied from it when cached)
  uint64_t bounced_bytes = 0;   // of the requested bytes, those copied out of a bounce buffer
  uint64_t resubmits = 0;       // short reads, EAGAIN, EINTR continued; http ranges retried
  uint64_t network_bytes = 0;   // received over http(s): the bodies of ranges, retried ones too
  // Per route taken (indexed by ReadRoute, plan.h): the reads and their bytes. Page-cache
  // copies were no read at all (the workers copied the cached bytes into fresh pages); mapped
  // bytes come in on first touch.
  RouteCounts routes{};
  RouteCount taken(ReadRoute route) const { return routes[static_cast<size_t>(route)]; }
  // Quantized weights planned to be decoded by their device (ConversionSite::kDevice) whose
  // device lacks the kernels: the workers decoded them and the device copied the values (the
  // backend line names the device).
  uint64_t conversions_moved = 0;
  // With LoadOptions::hub_cache, what was cached ("cached N file(s) of ORG/REPO at COMMIT in
  // DIR ..."), and what was left out and why; else empty.
  std::string cache;
};

enum class ReadBackend { kAuto, kUring, kPread };

struct LoadHooks;  // testing only: runtime/pipeline/load_hooks.h

struct LoaderOptions {
  // The machine to load on: its GPUs are the devices "cuda:N" tensors go to. Unset:
  // Platform::Default(), this machine. A simulated platform places them on simulated devices.
  std::shared_ptr<const Platform> platform;
  ReadBackend backend = ReadBackend::kAuto;
  int queue_depth = 32;                 // reader pieces in flight per load (io/reader.h)
  int worker_threads = 0;               // conversion workers; 0 = hardware threads
  uint64_t staging_bytes = 256ULL << 20;  // staging pool per load (bounds host memory in use)
  // At most this many bytes of reads in the kernel's hands at once (io/reader.h,
  // max_bytes_in_flight); 0: no bound but queue_depth pieces of 4 MiB. A device shares itself
  // among the reads it holds, so the last piece of the module due next completes with those
  // after it: a smaller bound keeps completions closer to the plan's order, at the risk of an
  // idle device.
  uint64_t bytes_in_flight = 0;
  bool direct_io = true;                // O_DIRECT where the file system and alignment allow
  // Fault injection for loadstone's own tests (runtime/pipeline/load_hooks.h); null otherwise.
  std::shared_ptr<const LoadHooks> hooks;
};

struct LoadOptions {
  // Fail with OutOfMemory when the destination buffers would exceed this many bytes (0: no
  // limit beyond what the system gives).
  uint64_t host_memory_limit = 0;
  // Record every read, conversion and completion for LoadHandle::WriteTrace.
  bool trace = false;
  // Called as each tensor is in place, in completion order, on the load's callback thread (see
  // the top of this file). A throw fails the load: CallbackFailed, "an on-tensor callback threw
  // for tensor 'NAME': WHAT".
  std::function<void(const Tensor&)> on_tensor;
  // Called after each tensor is in place with the load's progress then, like on_tensor (after
  // it): for a progress display or a log line without polling progress(). A throw fails the
  // load: CallbackFailed, "LoadOptions::on_progress threw after tensor 'NAME': WHAT".
  std::function<void(const Progress&)> on_progress;
  // The memory of each tensor the plan gives to the caller (TensorPlan::caller_memory): called
  // once per such tensor, before its first byte is read, on the Loader's event-loop thread (so
  // it must be quick: a lookup); must return exactly the tensor's planned bytes
  // (TensorPlan::nbytes), host memory that stays valid and untouched by others until Done()
  // resolves. The tensor handed out then points into it and does not own it; a load that fails
  // or is cancelled may have written part of it. Unset while the plan has such tensors, or a
  // span of another size: the load fails with InvalidArgument naming the tensor; a callback that
  // throws: CallbackFailed naming it.
  std::function<std::span<std::byte>(const TensorInfo& tensor, const TensorPlan& plan)> destination;
  // Set: the checkpoint is the Hub's (an hf:// address) and what the load streams is also
  // written to this Hugging Face cache folder, "" for huggingface_hub's own (HF_HUB_CACHE, else
  // $HF_HOME/hub, else ~/.cache/huggingface/hub), in its layout (blobs/, snapshots/COMMIT/,
  // refs/REVISION): the next start reads it locally and huggingface_hub finds it too. Once every
  // tensor is in place the rest of each file (its header, tensors not loaded) is fetched, the
  // blobs renamed into place and linked; the index and config.json are cached as well.
  // ReadStats::cache says what was done; nothing of the cache fails the load. A failed or
  // cancelled load leaves nothing in the cache but its folders. Any other checkpoint: the load
  // fails with InvalidArgument.
  std::optional<std::string> hub_cache;
};

class LoadHandle {
 public:
  LoadHandle() = default;
  // Cancels and waits, unless already done; once it returns, the load's memory is freed except
  // the tensors the caller still holds. Inside one of the load's own callbacks: cancels, and
  // returns at once (see the top of this file).
  ~LoadHandle();
  LoadHandle(LoadHandle&&) noexcept;
  LoadHandle& operator=(LoadHandle&&) noexcept;
  LoadHandle(const LoadHandle&) = delete;
  LoadHandle& operator=(const LoadHandle&) = delete;

  // False for a default-constructed or moved-from handle, whose accessors all answer with an
  // InvalidArgument ("holds no load"): Done() and WriteTrace() return it, Tensor() holds it,
  // progress() and read_stats() are zeros, Tensors() is empty, Cancel() does nothing.
  bool valid() const;

  // Resolves once every tensor is in place and every on-tensor callback has returned (OK), or
  // the load failed (a read, a callback that threw: CallbackFailed, a plan for another
  // checkpoint) or was cancelled.
  std::shared_future<Status> Done() const;

  // Resolves when that tensor is in place; holds a loadstone::Error when the load fails first.
  // An unknown name gives a future that already holds a NotFound Error.
  std::shared_future<loadstone::Tensor> Tensor(std::string_view name) const;

  // Calls `callback` for every tensor already in place, then for each one as it lands, on the
  // load's callback thread; once the load has finished, for every tensor at once on this thread
  // (an exception then leaves OnTensor). Errors: InvalidArgument on an empty handle.
  Status OnTensor(std::function<void(const loadstone::Tensor&)> callback);

  // Calls `callback` once with Done()'s status, on the load's callback thread after the load's
  // last on-tensor callback, once Done() has resolved; at once on this thread when the load has
  // already finished (an exception then leaves OnDone). For code that waits without blocking a
  // thread (loadstone/asio.h). An exception from it on the callback thread is counted in
  // late_callback_error(). Errors: InvalidArgument on an empty handle (the callback is not
  // called).
  Status OnDone(std::function<void(Status)> callback);

  // Calls `callback` once: with OK and the tensor when tensor `name` is in place, or with the
  // load's failure (and an empty Tensor) when the load ends without it; on the load's callback
  // thread, or at once on this thread when the answer is already known. A callback that throws before
  // the load has ended fails the load (CallbackFailed), like an on-tensor callback; after, it
  // is counted in late_callback_error(). Errors (the callback is not called): NotFound for a
  // name the load does not have, InvalidArgument on an empty handle.
  Status OnTensorReady(std::string_view name,
                       std::function<void(Status, loadstone::Tensor)> callback);

  // Resolves when every tensor of module `prefix` is in place (on its device): every tensor
  // named `prefix` or starting with `prefix` + "." ("model.layers.3" holds
  // "model.layers.3.mlp.up_proj.weight", not "model.layers.30.…"; "" is every tensor), with OK;
  // or with the load's failure or cancellation when it ends without one of them. A prefix that
  // no tensor of the load is under gives a future that already holds NotFound (InvalidArgument
  // on an empty handle). The waits are the OnTensorReady ones: no thread is blocked.
  std::shared_future<Status> Module(std::string_view prefix) const;

  // Module(prefix) as a callback: `callback` is called once, with OK when every tensor of the
  // module is in place or with the load's failure, on the load's callback thread (at once on
  // this thread when already known), and is an OnTensorReady callback in every other way (one
  // that throws before the load ends fails it). Errors (the callback is not called): NotFound
  // for a prefix no tensor is under, InvalidArgument on an empty handle.
  Status OnModuleReady(std::string_view prefix, std::function<void(Status)> callback) const;

  // Calls `callback` once for each module of the plan's order (LoadPlan::modules), in that
  // order: with OK once every tensor of it and of every module before it is in place — the step
  // an engine running the model layer by layer takes — or, once and then never again, with the
  // load's failure for the first module not in place when the load ends without it. On the
  // load's callback thread, or at once on this thread for the modules already known; never two
  // at once. An OnTensorReady callback in every other way. Errors: InvalidArgument on an empty
  // handle.
  Status OnModules(std::function<void(const PlanModule&, Status)> callback) const;

  // Moves the reads of module `prefix` (as Module names it; with the scales its quantized
  // weights wait for) not yet issued to the front of the load's queue, ahead of the plan's
  // order and of modules prioritized before: an engine asked for a module (an expert, a LoRA)
  // that is not loaded yet has it first. Returns at once; reads already in flight go on, and
  // once the load has ended, or when every read of the module is issued, nothing changes.
  // Thread-safe; may be called from a callback. Errors: NotFound for a prefix no tensor is
  // under, InvalidArgument on an empty handle.
  Status Prioritize(std::string_view prefix) const;

  // Every tensor once Done() is OK, in plan order; empty before that.
  std::vector<loadstone::Tensor> Tensors() const;

  Progress progress() const;
  // The read backend this load uses, e.g. "io_uring (O_DIRECT where aligned, 64 deep)"; waits
  // for the load to have opened its files (an instant after Load), so it is never empty.
  std::string backend() const;
  // How the reader moved the bytes; zeros until Done() has resolved.
  ReadStats read_stats() const;

  // OK, or CallbackFailed naming the first callback that threw after the load's end was decided
  // (an OnDone callback, an OnTensorReady callback told the load ended without its tensor), with
  // the exception's message and how many did. Such an exception cannot change Done(), which has
  // resolved or is resolving; loadstone swallows it and keeps it here rather than write to
  // stderr. Final once Done() has resolved and its OnDone callbacks have returned.
  Status late_callback_error() const;

  // Stops the load: outstanding reads are cancelled, Done() becomes Cancelled. Idempotent.
  void Cancel();

  // Writes the Chrome trace-event JSON of this load (needs LoadOptions::trace) to `path`.
  Status WriteTrace(const std::string& path) const;

  struct State;  // runtime/pipeline/load_state.h

 private:
  friend class Loader;  // the only maker of handles
  explicit LoadHandle(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

class Loader {
 public:
  explicit Loader(const LoaderOptions& options = {});
  // Cancels the loads still running and waits for them and their callbacks; once it returns, a
  // load whose handle is gone is freed. Handles still held keep working (their loads have
  // ended). REQUIRES: not called from a callback of one of its loads (it would wait for itself).
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts loading; returns at once. Tensors the plan offloads to disk (LoadPlan::offloaded)
  // are not part of the load: WriteOffload and OffloadStore (offload.h) handle them. Errors (a file that cannot be opened, no memory, a plan
  // made for another checkpoint: LoadPlan::checkpoint_fingerprint) arrive through the handle's
  // futures, never as exceptions.
  LoadHandle Load(const Checkpoint& checkpoint, const LoadPlan& plan,
                  const LoadOptions& options = {});

  // Cancels every load this Loader is running, as LoadHandle::Cancel does each: their Done()
  // becomes Cancelled, unless a load finished first. Returns at once, without waiting for them;
  // the Loader stays as it was, and a load started after CancelAll runs as usual (one started
  // on another thread meanwhile may be cancelled or not). Thread-safe; may be called from a
  // callback.
  void CancelAll();

  // The machine this Loader loads on (LoaderOptions::platform, or Platform::Default()).
  std::shared_ptr<const Platform> platform() const;

 private:
  friend struct LoaderAccess;  // runtime/pipeline/load_hooks.h: the hooks, for loadstone's parts
  struct Impl;  // runtime/pipeline/loader.cc
  std::unique_ptr<Impl> impl_;
};

}  // namespace loadstone

#endif  // LOADSTONE_LOADER_H_
