// What a load's two stages (read_stage.h, placement_stage.h) may ask of the load that owns them,
// and the parts of it they share. The load (LoadHandle::State, load_state.h) implements LoadLink:
// an event a stage posts runs on the load's event loop and then the load's one scheduler decides
// what runs next — a stage records what happened and returns: no event issues reads or finishes
// the load itself (only the scheduler calls ReadStage::Pump and the finish rule). Everything here
// is used on the event loop, except OnLoop and CancelIfAskedAt, which the workers and the devices
// call too.
#ifndef LOADSTONE_RUNTIME_PIPELINE_LOAD_LINK_H_
#define LOADSTONE_RUNTIME_PIPELINE_LOAD_LINK_H_

#include <asio/io_context.hpp>
#include <asio/thread_pool.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"
#include "runtime/pipeline/load_hooks.h"

namespace loadstone::pipeline {

class Destinations;
class TensorSlots;
class TraceRecorder;

class LoadLink {
 public:
  // Runs `event` on the event loop, then the load's scheduler; the load (and so the stage that
  // posted it) outlives the event. Thread-safe.
  virtual void OnLoop(std::function<void()> event) = 0;
  // Keeps the load, and its stages, alive while held: for work posted to the workers or a device.
  virtual std::shared_ptr<const void> Hold() = 0;
  // Records the load's first error and stops it: no more reads are issued; work in flight ends.
  virtual void Fail(Status status) = 0;
  virtual bool stopping() const = 0;
  // Tensor `t` has `source_bytes` more of its file bytes in place (its future resolves with the
  // last); AdvanceChunk: each CPU tensor of read `id` by its piece of the read.
  virtual void Advance(uint32_t t, uint64_t source_bytes) = 0;
  virtual void AdvanceChunk(uint64_t id) = 0;
  // Read `id` is staged and whole: the placement stage's from here (PlacementStage::OnStaged).
  virtual void Staged(uint64_t id) = 0;
  // Cancels the load when its test hook asks for it at `stage` (LoadHooks::cancel_at).
  // Thread-safe.
  virtual void CancelIfAskedAt(LoadStage stage) = 0;
  // Adds "; `note`" to the load's backend line.
  virtual void Note(std::string_view note) = 0;

 protected:
  virtual ~LoadLink() = default;
};

// The load's parts its stages use; all of them outlive the stages.
struct StageContext {
  LoadLink& load;
  asio::io_context& loop;
  asio::thread_pool& workers;
  size_t workers_count;  // threads in `workers`
  const Checkpoint& checkpoint;
  const LoadPlan& plan;
  TensorSlots& tensors;        // each tensor's memory and bytes still to come
  Destinations& destinations;  // where each tensor's memory comes from
  TraceRecorder& trace;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_LOAD_LINK_H_
