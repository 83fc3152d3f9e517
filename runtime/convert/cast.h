// Casting a buffer of elements from one dtype to another on the CPU, with PyTorch's rounding
// (specs/quant.md, "Float conversions"). This is what a dtype policy runs on the worker
// threads, and the reference that device kernels are tested against.
//
// What converts: sources f32, f16, bf16, f64, f8_e4m3fn and f8_e5m2; targets f32, f16 and
// bf16; and any dtype to itself (a copy). Integer, bool and the other float8/float4/float6
// dtypes are never converted: a dtype policy leaves such tensors as they are. Every
// conversion decodes the source to f32 (exactly, or for f64 with one round to nearest even)
// and encodes that f32 into the target; see docs/conversions.md for the bit-level rules.
//
// Buffers are little-endian element arrays with no alignment requirement. All functions are
// pure: safe for concurrent use by multiple threads, no allocation, no global state.
#ifndef LOADSTONE_RUNTIME_CONVERT_CAST_H_
#define LOADSTONE_RUNTIME_CONVERT_CAST_H_

#include <cstddef>
#include <cstdint>

#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone::convert {

// True when CastBuffer(from, to, ...) converts: from == to, or from is one of f32, f16, bf16,
// f64, f8_e4m3fn, f8_e5m2 and to is one of f32, f16, bf16.
bool CanCast(DType from, DType to);

// Bytes that `count` elements of `dtype` take (rounded up for packed sub-byte dtypes).
uint64_t ElementBytes(DType dtype, uint64_t count);

// Converts `count` elements at `src` (dtype `from`) into `dst` (dtype `to`).
// REQUIRES: src holds ElementBytes(from, count) bytes and dst ElementBytes(to, count) bytes;
// the two ranges do not overlap unless from == to (a copy, which allows any overlap).
// Either pointer may be null when count == 0.
// Returns InvalidArgument, naming both dtypes, when !CanCast(from, to); writes nothing then.
Status CastBuffer(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t count);

// Encodes `count` f32 elements as f8_e4m3fn: round to nearest even; |x| >= 480, inf and NaN
// become NaN (0x7F | sign). Same buffer rules as CastBuffer. Not part of the dtype policy.
void CastF32ToF8E4M3(const std::byte* src, std::byte* dst, uint64_t count);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_CAST_H_
