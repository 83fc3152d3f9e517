// A tensor's file bytes into C-contiguous little-endian elements: the gather of a strided view
// (a transposed or expanded tensor that torch.save wrote as it was in memory) and the byte swap
// of a big-endian archive. It runs on the CPU workers before any cast.
#ifndef LOADSTONE_RUNTIME_CONVERT_RELAYOUT_H_
#define LOADSTONE_RUNTIME_CONVERT_RELAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "loadstone/status.h"

namespace loadstone::convert {

// Writes the `shape` elements of `elem_bytes` bytes each that `strides` (in elements) lay out
// from `src`, in C order, into `dst`; swaps each element's bytes when `swap`. Empty `strides`:
// `src` is already contiguous. REQUIRES: every element the strides reach lies in `src`
// (src_bytes), `dst` holds the product of `shape` elements, the two do not overlap.
// InvalidArgument when strides and shape differ in rank or an element would fall outside `src`.
Status Relayout(const std::byte* src, uint64_t src_bytes, std::span<const uint64_t> shape,
                std::span<const uint64_t> strides, uint64_t elem_bytes, bool swap, std::byte* dst);

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_RELAYOUT_H_
