// The planned tensors of one load, one slot each (LoadPlan::tensors[i] is slot i): its future,
// resolved once (with its Tensor when whole, or with the load's error), its memory once the
// destinations made it, and its source bytes not yet in place — with the load's progress counted
// from them. Changed on the load's event loop only (the workers write into a slot's memory, never
// the slot); the futures and the counters are read from any thread.
#ifndef LOADSTONE_RUNTIME_PIPELINE_TENSOR_SLOTS_H_
#define LOADSTONE_RUNTIME_PIPELINE_TENSOR_SLOTS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "runtime/pipeline/destinations.h"

namespace loadstone::pipeline {

class TensorSlots {
 public:
  // `checkpoint` and `plan` outlive this (they are the load's). `indexed`: the plan passed
  // CheckPlanFor, so its source indices may be used (else no name is found, and no slot waits
  // for bytes: the load fails before any).
  TensorSlots(const Checkpoint& checkpoint, const LoadPlan& plan, bool indexed);

  size_t size() const { return slots_.size(); }
  // The slot of the tensor named `name`, if this load has it (the checkpoint's own name index,
  // then 4 bytes per checkpoint tensor).
  std::optional<uint32_t> IndexOf(std::string_view name) const;
  const std::shared_future<Tensor>& future(uint32_t t) const { return slots_[t].future; }

  // Its memory, made once by `destinations` (Destinations::ForTensor); a no-op when it has some.
  Status Ensure(uint32_t t, Destinations& destinations);
  // The one buffer of shared-buffer read `chunk`, made once, each of its tensors pointing into
  // it. Errors: the destinations', not yet naming the read.
  Status EnsureShared(const ReadChunk& chunk, Destinations& destinations);
  std::byte* data(uint32_t t) const { return slots_[t].data; }
  const std::shared_ptr<std::byte>& buffer(uint32_t t) const { return slots_[t].buffer; }

  // Counts `source_bytes` more of tensor `t` in place (and its placed bytes in proportion);
  // true when that made it whole, once.
  bool Place(uint32_t t, uint64_t source_bytes);
  bool done(uint32_t t) const { return slots_[t].done; }
  // Waits for no byte (an empty tensor): Place(t, 0) makes it whole.
  bool empty(uint32_t t) const { return slots_[t].remaining == 0 && !slots_[t].done; }
  // Resolves whole tensor `t`'s future.
  void Resolve(uint32_t t, Tensor tensor);
  // Resolves every tensor not whole with `error`, and lets go of its memory.
  void FailRest(const Status& error);

  uint64_t bytes_placed() const { return bytes_placed_.load(); }
  size_t tensors_done() const { return tensors_done_.load(); }
  bool all_done() const { return tensors_done_.load() == slots_.size(); }

 private:
  struct Slot {
    std::promise<Tensor> promise;
    std::shared_future<Tensor> future;
    std::shared_ptr<std::byte> buffer;  // destination (null until its first read, or mapped)
    std::byte* data = nullptr;
    uint64_t remaining = 0;             // source bytes not yet in place
    bool done = false;
  };

  const Checkpoint& checkpoint_;
  const LoadPlan& plan_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> index_;  // per checkpoint tensor: its slot, or ~0
  std::atomic<uint64_t> bytes_placed_{0};
  std::atomic<size_t> tensors_done_{0};
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_TENSOR_SLOTS_H_
