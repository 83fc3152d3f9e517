// LoadPlan: what a load will do, as pure data — for every tensor its destination, target dtype
// and conversion, and the read schedule (coalesced chunks per file, in priority order).
//
//   loadstone::PlanOptions opt;
//   opt.dtype = loadstone::DType::kBF16;
//   opt.keep_in_fp32 = {"norm"};
//   auto plan = loadstone::Plan(*ckpt, opt);   // printable with plan->ToString()
//
// Plans are built without I/O and may be inspected, tested and reused for several loads of the
// same checkpoint.
#ifndef LOADSTONE_PLAN_H_
#define LOADSTONE_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone {

enum class Conversion {
  kNone,  // bytes land as they are in the file
  kCast,  // a float cast (f32/f16/bf16/f64/float8 → f32/f16/bf16), exact as PyTorch
};

struct TensorPlan {
  size_t source = 0;             // index into Checkpoint::tensors()
  std::string device = "cpu";    // "cpu" or "cuda:N" (disk: see the offload issue)
  DType dtype = DType::kF32;     // the dtype it will have once loaded
  Conversion conversion = Conversion::kNone;
  uint64_t nbytes = 0;           // bytes once loaded
};

// One read: `length` bytes at `offset` of `file`, covering the given tensors' bytes (whole
// small tensors coalesced, or one piece of a large tensor).
struct ReadChunk {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<uint32_t> tensors;  // indices into LoadPlan::tensors, in file order
  bool staged = false;            // read into staging (conversion or coalescing), not in place
};

struct PlanOptions {
  // Target dtype for floating-point tensors; integer and bool tensors are never cast.
  std::optional<DType> dtype;
  // Tensors kept in float32 when `dtype` is a reduced float: a pattern matches a tensor when it
  // equals one of its dotted components or a run of them ((^|\.)pattern($|\.)).
  std::vector<std::string> keep_in_fp32;
  // Where tensors go: "cpu" (default), one device ("cuda:1", "1"), or a mode inferred exactly as
  // accelerate infers it ("auto", "balanced", "balanced_low_0", "sequential"; see
  // device_map.h), with these budgets and no-split blocks.
  std::string device_map = "cpu";
  std::optional<MaxMemory> max_memory;
  std::optional<std::vector<std::string>> no_split;
  // Largest single read; larger tensors are read in pieces of this size.
  uint64_t max_chunk = 16ULL << 20;
  // Tensors smaller than this are coalesced with their file neighbours into one staged read.
  uint64_t coalesce_below = 1ULL << 20;
};

struct LoadPlan {
  std::vector<TensorPlan> tensors;  // priority order: shard order, then natural name order
  std::vector<ReadChunk> reads;     // the read schedule, in priority order
  DeviceMap device_map;             // the map used ({"": cpu} for a plain CPU load)
  std::vector<std::string> warnings;  // from the device-map planner
  uint64_t read_bytes = 0;          // bytes read from storage
  uint64_t placed_bytes = 0;        // bytes once loaded (after conversion)

  // A human summary: tensors per device and dtype, conversions, reads.
  std::string ToString() const;
};

// Plans a load of `checkpoint`. Errors: InvalidArgument (unknown device, a dtype that cannot be
// a cast target, a tensor no map entry covers), Unsupported (disk offload, before its issue).
Result<LoadPlan> Plan(const Checkpoint& checkpoint, const PlanOptions& options = {});

}  // namespace loadstone

#endif  // LOADSTONE_PLAN_H_
