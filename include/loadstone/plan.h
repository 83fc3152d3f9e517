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

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone {

enum class Conversion {
  kNone,  // bytes land as they are in the file
  kCast,  // a float cast (f32/f16/bf16/f64/float8 → f32/f16/bf16), exact as PyTorch
  // A float8 weight times its block scales (specs/quant.md, "FP8 weights"), into `dtype`.
  kDequantFp8Block,
};

// "none", "cast", "fp8-block-dequant".
std::string_view ConversionName(Conversion conversion);

struct TensorPlan {
  size_t source = 0;             // index into Checkpoint::tensors()
  std::string device = "cpu";    // "cpu" or "cuda:N" (disk: see the offload issue)
  DType dtype = DType::kF32;     // the dtype it will have once loaded
  Conversion conversion = Conversion::kNone;
  uint64_t nbytes = 0;           // bytes once loaded
  // kDequantFp8Block: the scales (an index into LoadPlan::tensors, planned and read before this
  // tensor, loaded as stored) and the rows x columns of the weight that one scale covers.
  uint32_t scale = 0;
  uint64_t block_rows = 0;
  uint64_t block_cols = 0;
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
  // Scaled float8 weights: a 2-D float8 tensor `W` with a sibling `W_scale_inv` (DeepSeek-V3:
  // f32, ceil(rows / block[0]) x ceil(cols / block[1]) scales) or `W_scale` (compressed-tensors:
  // f32/bf16/f16, per tensor, channel, group or block, told apart by its shape; a block scale
  // uses this block when it fits, else an exact division). With `dtype` set, each such weight is
  // dequantized into `dtype` (the scales stay as stored); without, both load as stored. The
  // block is the checkpoint's quantization_config.weight_block_size.
  std::array<uint64_t, 2> fp8_block = {128, 128};
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
// a cast target, a tensor no map entry covers, float8 scales that fit no rule of `fp8_block`),
// Unsupported (disk offload, before its issue; a float8 weight and its scales on two devices).
Result<LoadPlan> Plan(const Checkpoint& checkpoint, const PlanOptions& options = {});

}  // namespace loadstone

#endif  // LOADSTONE_PLAN_H_
