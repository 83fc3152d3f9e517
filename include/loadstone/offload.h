// Disk offload: tensors a device map sends to "disk" (LoadPlan::offloaded), written into an
// offload folder in accelerate's format or read in place from their safetensors file, and handed
// back as OffloadedTensors that materialise on any device when they are needed, with a
// prefetcher that streams the next offloaded block while the current one runs.
//
//   PlanOptions opt;  opt.device_map = "auto";  opt.max_memory = ...;  opt.offload_folder = "off";
//   auto plan = loadstone::Plan(ckpt, opt);
//   auto load = loader->Load(ckpt, *plan);                  // everything but the disk tensors
//   auto written = loadstone::WriteOffload(*loader, ckpt, *plan);   // off/index.json, off/*.dat
//   auto store = loadstone::OffloadStore::Open(loader, ckpt, *plan);
//   loadstone::Tensor w = (*store)->Materialize("blocks.7.ff.weight", Device::Cuda(0)).get();
//
// The folder is what accelerate's offload_weight + save_offload_index write, byte for byte:
// index.json (Python's json.dump(indent=2), merged into an existing one: entries of the same
// name replaced in place, new ones appended) mapping each name to {"dtype", "shape"} (numpy
// names; bfloat16 stored as its int16 view; a scalar as one element with shape []) and one raw
// C-order NAME.dat per tensor; in-place tensors are entries {"safetensors_file", "weight_name",
// "dtype"} (the dtype: the torch name it is cast to when read), as transformers gives accelerate.
// diffusers writes every disk tensor as NAME.dat and always asks for a folder; loadstone reads
// plain safetensors tensors in place instead (no copy, no folder), as transformers does. accelerate's OffloadedWeightsLoader
// reads it, and Checkpoint::Open reads it back (CheckpointFormat::kOffloadFolder).
//
// Thread safety: WriteOffload may run while the plan's load runs. An OffloadStore is thread-safe.
#ifndef LOADSTONE_OFFLOAD_H_
#define LOADSTONE_OFFLOAD_H_

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"

namespace loadstone {

struct OffloadOptions {
  // Host memory the offloaded tensors pass through: they are loaded in batches of at most this
  // many bytes (a larger tensor alone), each batch written, then freed; the next batch loads
  // while one is written, so two batches are in memory at most.
  uint64_t batch_bytes = 256ULL << 20;
  LoadOptions load;  // for each batch's load (host_memory_limit, trace, progress)
  // Asked every 50 ms while a batch loads and between batches (from the calling thread): true
  // cancels the batch's load, and WriteOffload then fails with Cancelled as any failure does
  // (the .dat files it wrote removed, index.json as it was). Unset: never cancelled.
  std::function<bool()> cancelled;
};

struct OffloadSummary {
  std::string index_path;       // folder/index.json; empty when nothing needed a folder
  size_t written = 0;           // NAME.dat files written
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;      // read from the checkpoint to write them
  size_t in_place = 0;          // tensors referenced in their safetensors file
};

// Writes every offloaded tensor of `plan` that is not read in place into plan.offload_folder
// (created when missing) as NAME.dat, converted as planned (one stored as it is in the file,
// contiguous and unconverted, is copied file to file inside the kernel; others are loaded in
// batches through `loader`), and records it, and the in-place
// ones, in index.json. Nothing to write and no folder: OK, nothing done. A failure removes the
// .dat files this call wrote and leaves index.json as it was. Errors: those of the loads,
// IOError (a write, naming the file and offset: ENOSPC says the disk is full), Unsupported (a
// dtype numpy has no name for: float8, float4), InvalidArgument (a name that cannot be a file
// name, a plan for another checkpoint).
Result<OffloadSummary> WriteOffload(Loader& loader, const Checkpoint& checkpoint,
                                    const LoadPlan& plan, const OffloadOptions& options = {});

// The offloaded tensors of one plan, after WriteOffload: each one loads on demand, through the
// Loader, from its NAME.dat or in place from its safetensors file.
class OffloadStore {
 public:
  // `loader` loads every materialisation. Errors: those of opening the offload folder
  // (NotFound when WriteOffload has not written it), NotFound (a planned tensor the folder lacks).
  static Result<std::shared_ptr<OffloadStore>> Open(std::shared_ptr<Loader> loader,
                                                    const Checkpoint& checkpoint,
                                                    const LoadPlan& plan);
  ~OffloadStore();  // cancels materialisations still running and waits for them

  // The offloaded tensor names, in plan order.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(std::string_view name) const;
  // How tensor `name` is stored: "off/a.weight.dat" or "/m/model.safetensors (in place, offset N)".
  Result<std::string> Where(std::string_view name) const;

  // Loads tensor `name` onto `device` (a GPU or the CPU): the future resolves when it is there,
  // in its planned dtype, or holds a loadstone::Error. Unknown names give NotFound at once.
  std::shared_future<Tensor> Materialize(std::string_view name, const Device& device);
  // Loads several at once, in one load: a handle whose Tensor(name) futures resolve as each
  // lands. Errors: NotFound for a name not offloaded, those of planning the load.
  Result<LoadHandle> Fetch(const std::vector<std::string>& names, const Device& device);

 private:
  OffloadStore() = default;
  std::shared_ptr<Loader> loader_;
  std::vector<std::string> names_;
  // The catalog the tensors load from: the folder's (restricted to this plan's tensors), or the
  // source checkpoint's in-place tensors when no folder was needed.
  std::optional<Checkpoint> catalog_;
  std::map<std::string, DType, std::less<>> casts_;  // in-place tensors cast when they load
  std::mutex mu_;
  std::vector<LoadHandle> running_;  // guarded by mu_; pruned as they finish
};

// Streams offloaded blocks (each a list of tensor names, in execution order) to `device` one
// ahead (not thread-safe: one caller drives it): Get(i) returns block i's tensors once they are there and starts block i + 1, so the
// next block's reads overlap the caller's work on the current one (what accelerate's
// AlignDevicesHook does synchronously before each module's forward).
class OffloadPrefetcher {
 public:
  OffloadPrefetcher(std::shared_ptr<OffloadStore> store, std::vector<std::vector<std::string>> blocks,
                    Device device);
  // Block i's tensors in its order. Errors: InvalidArgument (no block i), those of the load.
  Result<std::vector<Tensor>> Get(size_t i);
  size_t size() const { return blocks_.size(); }
  // Block i's load has been started (by Get(i - 1) or Get(i)) and not yet taken.
  bool started(size_t i) const { return i < handles_.size() && handles_[i].valid(); }

 private:
  void Start(size_t i);
  std::shared_ptr<OffloadStore> store_;
  std::vector<std::vector<std::string>> blocks_;
  Device device_;
  std::vector<LoadHandle> handles_;  // per block; empty until started, and once taken
  std::map<size_t, Status> errors_;  // blocks whose load could not be planned
};

}  // namespace loadstone

#endif  // LOADSTONE_OFFLOAD_H_
