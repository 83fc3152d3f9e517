// The reads of one load, one record each (LoadPlan::reads[i] is chunk i): the route it takes —
// the plan's, settled for this load at its start, then at its turn (routes.h) —, the staging slot
// it holds while staged, its parts still being placed, and the routes taken, counted. Also how a
// read is named: in errors (the file, the byte range, its first tensors) and in the trace. Used
// on the load's event loop; Label, Args and Error also on a worker that holds the read (they read
// its route, which does not change while a worker has it).
#ifndef LOADSTONE_RUNTIME_PIPELINE_CHUNK_TABLE_H_
#define LOADSTONE_RUNTIME_PIPELINE_CHUNK_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/reader.h"
#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "runtime/pipeline/routes.h"
#include "runtime/pipeline/trace.h"

namespace loadstone::pipeline {

class ChunkTable {
 public:
  struct Chunk {
    // The planned route, then this load's (RouteAtStart, at Begin), then the one it took
    // (RouteAtTurn, when issued).
    ReadRoute route = ReadRoute::kInPlace;
    int slot = -1;       // its staging slot while staged (TakeStagingSlot .. ReleaseSlot)
    int parts_left = 0;  // CPU/device parts of a staged chunk not yet done
    // Into memory that exists (TensorPlan::memory_given: the caller's, pinned), and copies from a
    // mapping are guarded: when its bytes are cached, a worker copies them (routes.h).
    bool copy_when_cached = false;
    TraceRecorder::Clock::time_point submitted{};  // when tracing
  };

  // Both outlive the table (they are the load's).
  ChunkTable(const Checkpoint& checkpoint, const LoadPlan& plan)
      : checkpoint_(checkpoint), plan_(plan) {}

  Chunk& operator[](uint64_t id) { return chunks_[id]; }
  const Chunk& operator[](uint64_t id) const { return chunks_[id]; }

  // Each read's route for this load (RouteAtStart); `guarded`: this load's copies from a mapping
  // are guarded (io/mapped_copy.h), so reads into memory that exists copy cached bytes.
  void SettleAtStart(const StartFacts& facts, bool guarded);
  // The route read `id` takes now that its turn has come (RouteAtTurn): the one place where the
  // executor asks `reader` where its bytes are. `*cached`: their page-cache view, when asked and
  // they are there.
  ReadRoute RouteNow(uint64_t id, const io::Reader& reader, const std::byte** cached) const;
  // The largest read whose route (this load's) may stage it; 0 when none may.
  uint64_t LargestStaged() const;

  // Counts read `id` on the route it took (its record's).
  void Count(uint64_t id);
  const RouteCounts& counts() const { return counts_; }

  // `status` with the read named: "loading tensor 'A', 'B' and 3 more (bytes X..Y of 'FILE')".
  Status Error(uint64_t id, const Status& status) const;
  // For the trace: "NAME" or "NAME and 3 more"; the read's file, range, tensors, planned route
  // and the route it took (ReadRouteName) as JSON.
  std::string Label(uint64_t id) const;
  std::string Args(uint64_t id) const;

 private:
  const std::string& NameOf(uint32_t tensor) const {
    return checkpoint_.tensors()[plan_.tensors[tensor].source].name;
  }

  const Checkpoint& checkpoint_;
  const LoadPlan& plan_;
  std::vector<Chunk> chunks_;
  RouteCounts counts_{};
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_CHUNK_TABLE_H_
