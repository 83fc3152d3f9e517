// Weight updates in place: a running engine's weights (filled by LoadInto, LoadStateDict or a
// tensor-parallel LoadRank) take new values from a trainer's process group — bucketed broadcasts
// over c10d — or from a new checkpoint, under a version number, applied whole or not at all.
// Part of libloadstone_dist (target loadstone::dist); uses LibTorch's tensors.
//
//   // engine rank (after LoadInto(model, path)):
//   auto live = loadstone::LiveWeights::Of(loadstone::libtorch::PersistentStateDict(model));
//   auto update = loadstone::ProcessGroups::Connect({"10.0.0.1", 29600, 1 + engines, 1 + e}, 1);
//   auto report = loadstone::ReceiveWeights(**update, **live);      // blocks until applied
//   { auto use = (*live)->Use(); model->forward(x); }                // never sees half an update
//   // trainer (rank 0 of the same group):
//   loadstone::SendWeights(**update, named_tensors, /*version=*/step);
//
// An update is received into staging memory (the size of the engine's weights it writes, kept
// for the next update; an engine holding whole tensors receives the broadcasts straight into
// it), then, once every rank of the group has all of it, written into the live tensors under an
// exclusive lock that Use() holders wait for, and the version advances. A rank that dies, a name
// or shape that does not fit, or a stale version fails the update on every rank, and every
// engine keeps its weights and version as they were. One caveat across ranks: a rank that dies
// inside the last all-gather (every rank saying it has the update) may leave that gather
// finished on some ranks and not on others, and so some engines on the new version.
#ifndef LOADSTONE_WEIGHT_UPDATE_H_
#define LOADSTONE_WEIGHT_UPDATE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "loadstone/dist.h"
#include "loadstone/status.h"
#include "loadstone/tensor_parallel.h"

namespace loadstone {

// The tensors of a running engine that updates write, and the version they hold.
class LiveWeights {
 public:
  // One live tensor: the engine's own memory (on the CPU, contiguous) and the cut of the full
  // tensor it holds (a tensor-parallel part; dim -1: the whole tensor).
  struct Entry {
    std::string name;
    at::Tensor tensor;
    TensorShard cut;
  };

  // `tensors`: the engine's (e.g. libtorch::PersistentStateDict(model)); `share`: a
  // tensor-parallel rank's (LoadRank's RankLoad::share) — a tensor it names is that rank's part,
  // any other whole, and the tensors it says other ranks hold (their experts) are passed over
  // when an update brings them. Errors: InvalidArgument (a tensor not on the CPU or not
  // contiguous, a name twice, a part whose shape is not the share's), Unsupported (a dtype
  // loadstone lacks).
  static Result<std::unique_ptr<LiveWeights>> Of(
      std::vector<std::pair<std::string, at::Tensor>> tensors, const RankShare* share = nullptr,
      uint64_t version = 0);

  uint64_t version() const;
  // Hold while using the weights (a forward pass): an update waits for every holder, then writes
  // all its tensors at once.
  std::shared_lock<std::shared_mutex> Use() const;
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* Find(std::string_view name) const;
  // Whether `name` is a tensor another rank of the engine's group holds (RankShare::elsewhere).
  bool HeldElsewhere(std::string_view name) const;
  int tp_rank() const { return tp_rank_; }  // which part of each cut this engine holds

  // Writes `staged` (entry index → the new bytes of that entry, as many as it holds) as
  // `version`, all under the exclusive lock; InvalidArgument, nothing written, when the version
  // does not advance the live one by then. Callers: the update functions below.
  Status Apply(const std::vector<std::pair<size_t, const std::byte*>>& staged, uint64_t version);

  // Where a received update is staged: at least `bytes`, kept for the next update (an engine
  // updated every step pays for the memory once); ReleaseStaging frees it. Errors: OutOfMemory
  // (the host memory could not be had; none is held then). Not thread-safe: one update at a
  // time.
  Result<std::byte*> Staging(uint64_t bytes);
  void ReleaseStaging();

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name → entries_ index
  std::unordered_set<std::string> elsewhere_;
  uint64_t version_ = 0;
  int tp_rank_ = 0;
  std::unique_ptr<std::byte[]> staging_;
  uint64_t staging_bytes_ = 0;
  mutable std::shared_mutex mutex_;
};

// The trainer's, carried to the engines in the update's manifest (an engine's own are not used
// but for trainer_rank).
struct WeightUpdateOptions {
  // A tensor of at least alone_bytes is broadcast on its own, straight from the trainer's memory
  // (into the engine's staging when it holds the tensor whole); smaller ones are packed, at most
  // bucket_bytes a broadcast. An engine holding parts receives each broadcast into one of two
  // buffers and copies its parts out while the next arrives.
  uint64_t bucket_bytes = 256ULL << 20;
  uint64_t alone_bytes = 1ULL << 20;
  int trainer_rank = 0;  // the rank of the group that sends
};

struct WeightUpdateReport {
  uint64_t version = 0;         // the version now live
  size_t tensors = 0;           // tensors in the update
  uint64_t sent_bytes = 0;      // the trainer: bytes broadcast (the full tensors)
  uint64_t received_bytes = 0;  // an engine: bytes received (the full tensors)
  uint64_t applied_bytes = 0;   // an engine: bytes written into its live tensors (its parts)
  double transfer_seconds = 0;  // the broadcasts (with the copies into staging they overlap)
  double apply_seconds = 0;     // the write under the lock
};

// The trainer's side: sends `tensors` (whole, on the CPU, contiguous) as version `version` to
// every other rank of `groups`' world — a manifest (names, dtypes, shapes, version), every
// rank's agreement, then one broadcast per bucket, and every rank's word that it has it all.
// Errors: InvalidArgument (a tensor not on the CPU, not contiguous, or a name twice), an engine's
// refusal (IOError naming the rank), the broadcasts' (IOError).
Result<WeightUpdateReport> SendWeights(
    ProcessGroups& groups, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    uint64_t version, const WeightUpdateOptions& options = {});

// An engine rank's side of SendWeights: every tensor of the update must be one of `weights`'
// (its full shape and dtype) or one another rank holds (HeldElsewhere: received, not kept), and
// the version greater than theirs; its part of each is staged
// as the buckets arrive, then all written at once. Errors: InvalidArgument (a tensor the engine
// lacks or of another shape or dtype, a version not past the live one — every rank refuses the
// update), IOError (a rank that refused or died: the trainer's error says why), and nothing of
// the update is written.
Result<WeightUpdateReport> ReceiveWeights(ProcessGroups& groups, LiveWeights& weights,
                                          const WeightUpdateOptions& options = {});

// An update from tensors loaded some other way — a new checkpoint through Loader::Load (whole
// tensors) or LoadRank (a rank's parts): each must be one of `weights`' with its part's shape
// and dtype, on the CPU; all are written at once as `version`. Errors: InvalidArgument, and
// nothing is written.
Result<WeightUpdateReport> UpdateFromTensors(LiveWeights& weights,
                                             const std::vector<Tensor>& tensors,
                                             uint64_t version);

}  // namespace loadstone

#endif  // LOADSTONE_WEIGHT_UPDATE_H_
