// compressed-tensors `pack-quantized` weights in a catalog (shared/specs/quant.md): each
// `M.weight_packed` (int32) beside `M.weight_scale` and `M.weight_shape` is cataloged packed
// (scheme "ct-int2|4|8", element shape [out, in], decoded name "M.weight"), its shape,
// zero points and activation order read and checked here, at Open; the scales are loaded with
// the weight.
#ifndef LOADSTONE_IO_FORMATS_PACK_QUANTIZED_H_
#define LOADSTONE_IO_FORMATS_PACK_QUANTIZED_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "io/formats/limits.h"
#include "io/formats/small_reads.h"
#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Tensor `t`'s bytes (`what`: how errors call it): Unsupported beyond kMaxPackedIntTableBytes.
Result<std::vector<std::byte>> ReadTable(SmallReads* reads, const std::vector<CheckpointFile>& files,
                                         const TensorInfo& t, std::string_view what);

// Reads `g_idx` (int32 [state.cols], each a group below state.groups) into `out`; errors
// name `producer`, the tensor, its file and offset (Corruption; Unsupported beyond the bound).
Status ReadGroupIndex(SmallReads* reads, const std::vector<CheckpointFile>& files,
                      const TensorInfo& g_idx, const PackedIntState& state,
                      std::string_view producer, std::vector<int32_t>* out);

// Sets TensorInfo::packed (PackedIntState) on every pack-quantized weight of `tensors`. The code
// width comes from the packed shape (ceil(in * bits / 32) words a row; 2, 4 or 8 bits).
// Errors: Corruption naming the tensor, its file and offset (a shape that no width packs, scales
// or zero points of the wrong shape, a g_idx outside the groups), NotFound for a missing
// companion, Unsupported for one stored strided or big-endian or tables beyond the bound;
// IOError from reading.
Status CatalogPackQuantized(const std::vector<CheckpointFile>& files,
                            std::vector<TensorInfo>* tensors,
                            const std::function<TensorInfo*(std::string_view)>& find);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_PACK_QUANTIZED_H_
