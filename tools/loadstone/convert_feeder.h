// How `convert` streams: the tensors it writes, loaded by the ordinary pipeline in batches of a
// bounded size (a large tensor in flat pieces, each a view of its file: Checkpoint::WithTensors)
// as the writer asks for their bytes, and let go once written.
#ifndef LOADSTONE_TOOLS_CONVERT_FEEDER_H_
#define LOADSTONE_TOOLS_CONVERT_FEEDER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {

// Feeds the writer's fill callbacks: loads the batch holding the bytes asked for (and starts
// the next one, so that reading overlaps writing), copies them out. Memory stays near the
// staging pool plus two batches. `ckpt` and `interrupt` must outlive it.
class ConvertFeeder {
 public:
  ConvertFeeder(const Checkpoint& ckpt, std::optional<DType> dtype,
                const LoaderOptions& loader_options, const InterruptToCancel& interrupt);

  // Lays out the units of output tensor `tensor` (source `src`, `out_bytes` once converted;
  // `decoded`: a packed tensor dequantized; `scales`: a float8 weight's, when it is dequantized
  // with them) in the order the writer will ask for them. REQUIRES: before Seal().
  void AddTensor(size_t tensor, const TensorInfo& src, uint64_t out_bytes, bool decoded,
                 const TensorInfo* scales = nullptr);

  // Groups the units into batches of a bounded size each (a larger unit alone). REQUIRES: once,
  // after every AddTensor and before the first Fill.
  void Seal();

  // Bytes [offset, offset + chunk.size()) of output tensor `tensor`; Cancelled after Ctrl-C.
  Status Fill(size_t tensor, uint64_t offset, std::span<std::byte> chunk);

  uint64_t written() const { return written_; }  // bytes copied out by Fill so far
  size_t batches() const { return batches_.size(); }

 private:
  // One load unit: `count` elements of output tensor `tensor` from element `first`, as a view
  // of the source file (`view`), or the whole tensor with its own layout; `with` are the tensors
  // its conversion reads (a bitsandbytes weight's quant state), loaded beside it under their
  // names.
  struct Unit {
    size_t tensor = 0;
    uint64_t first = 0;      // first element
    uint64_t out_bytes = 0;  // bytes it has once converted
    TensorInfo view;
    std::vector<TensorInfo> with;
    // The view keeps its own name in its batch (a float8 weight: Plan pairs it with its scales
    // by name); the others are named by their unit number.
    bool named = false;
  };

  struct Batch {
    std::vector<size_t> units;  // indices into units_
    std::optional<Checkpoint> catalog;
    std::optional<LoadPlan> plan;
    LoadHandle load;
  };

  // A packed tensor decoded: GGUF blocks in pieces of whole blocks, each a packed view of its
  // own; a bitsandbytes weight whole, with its quant state (its absmax covers it whole), so its
  // decoded size is what one unit holds.
  void AddDecoded(size_t tensor, const TensorInfo& src, uint64_t out_bytes);
  // A contiguous tensor in flat pieces (casts are elementwise); a small or strided one whole.
  void AddPlain(size_t tensor, const TensorInfo& src, uint64_t out_bytes);
  // Plans and starts loading batch `b`, unless it was started already.
  Status Start(size_t b);
  // The loaded tensor of unit `u`: its batch started (and the next one) and waited for; the
  // batches before it let go.
  Result<const Tensor*> Loaded(size_t u);

  const Checkpoint& ckpt_;
  std::optional<DType> dtype_;
  Loader loader_;
  const InterruptToCancel& interrupt_;
  std::vector<size_t> first_unit_;  // per output tensor: its first unit
  std::vector<Unit> units_;
  std::vector<size_t> batch_of_;    // per unit
  std::deque<Batch> batches_;
  size_t current_ = SIZE_MAX;
  uint64_t written_ = 0;
};

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_CONVERT_FEEDER_H_
