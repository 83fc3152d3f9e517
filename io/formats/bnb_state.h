// bitsandbytes weights in a catalog (shared/specs/quant.md, "bitsandbytes 4-bit" and "8-bit"):
// each weight `W` with a `W.quant_state.bitsandbytes__nf4|fp4` tensor, and each LLM.int8 weight
// `M.weight` with an `M.SCB` sibling, is cataloged packed, its quant state read and checked here,
// at Open — the JSON, the small tables and the int8 weight_format only; the per-block absmax and
// the row absmax (SCB) are loaded with the weight.
#ifndef LOADSTONE_IO_FORMATS_BNB_STATE_H_
#define LOADSTONE_IO_FORMATS_BNB_STATE_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "io/formats/limits.h"
#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Sets TensorInfo::packed on every bitsandbytes weight of `tensors`: scheme "bnb-nf4" / "bnb-fp4"
// (element shape, Bnb4State) or "bnb-int8" (BnbInt8State). `find` looks a tensor up by name;
// `files` are the checkpoint's. Errors: Corruption naming the tensor, its file and offset for a
// state that breaks the spec (bad JSON, a quant type, block size or dtype bitsandbytes does not
// write, a weight, absmax or table of the wrong size or dtype, a stored quant_map that is not
// bitsandbytes' table), NotFound for a companion that is missing, Unsupported for one stored
// strided or big-endian or nested tables beyond kMaxNestedAbsmaxBytes; IOError from reading.
Status CatalogBitsandbytes(const std::vector<CheckpointFile>& files,
                           std::vector<TensorInfo>* tensors,
                           const std::function<TensorInfo*(std::string_view)>& find);

// bitsandbytes' own value of each 4-bit code, as its CUDA kernels decode them (f32 constants):
// NF4's table, and FP4's magnitudes for codes 0-7 (codes 8-15 are their negatives; 8 is -0).
const std::array<float, 16>& Nf4Code();
const std::array<float, 8>& Fp4Magnitudes();

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_BNB_STATE_H_
