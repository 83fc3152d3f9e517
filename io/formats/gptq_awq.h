// GPTQ and AWQ (GEMM) weights in a catalog (shared/specs/quant.md): each `M.qweight` (int32)
// beside `M.qzeros` and `M.scales` is cataloged packed (PackedIntState, PackOrder::kGptq or
// kAwq; scheme "gptq-int4", "gptq_v2-int3", "awq-int4", ...; element shape [out, in]; decoded
// name "M.weight"), its zero points and g_idx read and checked here, at Open; the scales are
// loaded with the weight. Which producer wrote it comes from the model config's quant_method
// (config.json's quantization_config, or AutoGPTQ's quantize_config.json).
#ifndef LOADSTONE_IO_FORMATS_GPTQ_AWQ_H_
#define LOADSTONE_IO_FORMATS_GPTQ_AWQ_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Sets TensorInfo::packed on every GPTQ or AWQ weight of `tensors`. The code width comes from
// the shapes (GPTQ: qzeros holds out * bits / 32 words a group) and must agree with
// config.bits when the config gives it; the group size from g_idx, config.group_size or the
// shapes. qweight tensors with no quant_method of "gptq" or "awq" in `config` and no g_idx are
// left as stored, with a line in `warnings` (GPTQ is assumed where a g_idx says so).
// Errors: Corruption naming the tensor, its file and offset (shapes that disagree, a g_idx
// outside the groups), NotFound for a missing qzeros or scales, Unsupported for AWQ other
// than 4-bit GEMM, one stored strided or big-endian, or tables beyond kMaxPackedIntTableBytes;
// IOError from reading.
Status CatalogGptqAwq(const std::vector<CheckpointFile>& files, const ModelConfig& config,
                      std::vector<TensorInfo>* tensors,
                      const std::function<TensorInfo*(std::string_view)>& find,
                      std::vector<std::string>* warnings);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_GPTQ_AWQ_H_
