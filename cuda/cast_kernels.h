// Dtype casts on the GPU, bit-exact with runtime/convert's CPU reference (CastBuffer): the
// same conversions (sources f32, f16, bf16, f64, f8_e4m3fn, f8_e5m2; targets f32, f16, bf16),
// the same NaN, inf, subnormal and round-to-nearest-even rules — the kernels apply the very
// scalar functions of runtime/convert/float_bits.h to each element.
//
// No CUDA types: the stream is passed as an opaque pointer (a cudaStream_t), so that code
// outside cuda/ can call this. Compiled, not yet run on a GPU.
#ifndef LOADSTONE_CUDA_CAST_KERNELS_H_
#define LOADSTONE_CUDA_CAST_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "loadstone/dtype.h"
#include "loadstone/status.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::cuda {

// True when LaunchCast converts from -> to (from != to; a plain copy is the caller's memcpy).
// Equals runtime/convert's CanCast for every pair with from != to.
bool CanCastOnDevice(DType from, DType to);

// Enqueues the conversion of `count` elements at device address `src` (dtype `from`) into
// device address `dst` (dtype `to`) on `stream` (a cudaStream_t; nullptr = the legacy default
// stream) of the current device. Returns at once; the work is ordered on the stream.
// REQUIRES: src/dst hold ElementBytes(from/to, count) bytes on the current device and do not
// overlap; sm_count is the device's multiprocessor count (the grid size depends on it).
// Errors: InvalidArgument when !CanCastOnDevice(from, to); a launch error as its Status.
Status LaunchCast(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t count,
                  void* stream, uint32_t sm_count, int device);

// True when LaunchDequantFp8Block converts from -> to: equals runtime/convert's
// CanDequantFp8Block.
bool CanDequantFp8BlockOnDevice(DType from, DType to);

// Enqueues the block dequant of `count` float8 elements at device address `src` — elements
// first .. first + count of the row-major weight that `layout` describes, whose `scales` is a
// device address — into `dst` (dtype `to`), bit-exact with convert::DequantFp8Block. Same
// stream, device and error rules as LaunchCast. Compiled, not yet run on a GPU.
Status LaunchDequantFp8Block(DType from, DType to, const std::byte* src, std::byte* dst,
                             uint64_t first, uint64_t count, const convert::Fp8BlockScales& layout,
                             void* stream, uint32_t sm_count, int device);

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_CAST_KERNELS_H_
