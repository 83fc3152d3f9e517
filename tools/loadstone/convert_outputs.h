// What `convert` writes: each source tensor's fate from the plan of the whole checkpoint, the
// tensors written (name, dtype and shape once converted), and the order the feeder loads them in.
#ifndef LOADSTONE_TOOLS_CONVERT_OUTPUTS_H_
#define LOADSTONE_TOOLS_CONVERT_OUTPUTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
#include "tools/loadstone/convert_feeder.h"

namespace loadstone::cli {

// What becomes of each source tensor (indexed as Checkpoint::tensors()).
struct TensorFates {
  std::vector<DType> out_dtype;
  std::vector<bool> decoded;  // a packed tensor written dequantized
  std::vector<bool> dropped;  // a companion of a weight written dequantized: not written
  std::vector<const TensorInfo*> scales_of;  // a float8 weight's scales, dequantized with them
};

// Each tensor's fate as `whole` (the plan of all of `ckpt` with `options`) decides it. A
// quantized tensor is written dequantized (its companions then dropped) or as stored with them;
// Unsupported for the first tensor, in plan order, whose bytes alone would lose their type (GGUF
// blocks not dequantized).
Result<TensorFates> DecideFates(const Checkpoint& ckpt, const LoadPlan& whole,
                                const PlanOptions& options);

// The tensors convert writes, in the checkpoint's order.
struct ConvertOutputs {
  std::vector<TensorToWrite> tensors;
  std::vector<size_t> source_of;  // per output: its source tensor
  uint64_t total = 0;             // bytes to write
};

// Every tensor not dropped, under the name, dtype and shape it has once converted; its fill
// copies from `feeder`, then calls `after_fill`. `feeder` must outlive the outputs.
ConvertOutputs ListOutputs(const Checkpoint& ckpt, const TensorFates& fates,
                           ConvertFeeder& feeder, std::function<void()> after_fill);

// Lays the outputs out in `feeder` in the order the writer asks for their bytes (one file: in
// its layout order; a folder: shard by shard as SplitIntoShards splits them at `max_shard`
// bytes, each in its layout order), then seals it.
void LayOutFeeder(const Checkpoint& ckpt, const TensorFates& fates,
                  const ConvertOutputs& outputs, bool one_file, uint64_t max_shard,
                  ConvertFeeder& feeder);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_CONVERT_OUTPUTS_H_
