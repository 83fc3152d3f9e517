#include "runtime/convert/relayout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace loadstone::convert {
namespace {

void CopyElement(const std::byte* from, uint64_t n, bool swap, std::byte* to) {
  if (!swap) {
    std::memcpy(to, from, n);
    return;
  }
  for (uint64_t b = 0; b < n; ++b) to[b] = from[n - 1 - b];
}

}  // namespace

Status Relayout(const std::byte* src, uint64_t src_bytes, std::span<const uint64_t> shape,
                std::span<const uint64_t> strides, uint64_t elem_bytes, bool swap, std::byte* dst) {
  uint64_t numel = 1;
  for (uint64_t d : shape) numel *= d;
  if (numel == 0) return Status::OK();
  if (strides.empty()) {
    if (numel * elem_bytes > src_bytes) return Status::InvalidArgument("relayout past its source");
    if (!swap) {
      std::memcpy(dst, src, numel * elem_bytes);
      return Status::OK();
    }
    for (uint64_t i = 0; i < numel; ++i) {
      CopyElement(src + i * elem_bytes, elem_bytes, true, dst + i * elem_bytes);
    }
    return Status::OK();
  }
  if (strides.size() != shape.size()) {
    return Status::InvalidArgument(fmt::format("relayout of {} dims with {} strides", shape.size(),
                                               strides.size()));
  }
  uint64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  if ((last + 1) * elem_bytes > src_bytes) return Status::InvalidArgument("relayout past its source");
  // Dimensions of size 1 move nothing: left out, so that the odometer's steps are real ones.
  std::vector<uint64_t> dims, steps;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    dims.push_back(shape[d]);
    steps.push_back(strides[d]);
  }
  if (dims.empty()) {  // one element
    CopyElement(src, elem_bytes, swap, dst);
    return Status::OK();
  }
  // An odometer over the indices, the innermost dimension as a strided run.
  const size_t rank = dims.size();
  const uint64_t inner = dims[rank - 1], inner_stride = steps[rank - 1] * elem_bytes;
  std::vector<uint64_t> index(rank, 0);
  uint64_t base = 0;  // element offset of index[0..rank-2], inner 0
  std::byte* out = dst;
  for (uint64_t done = 0; done < numel; done += inner) {
    const std::byte* in = src + base * elem_bytes;
    for (uint64_t i = 0; i < inner; ++i, in += inner_stride, out += elem_bytes) {
      CopyElement(in, elem_bytes, swap, out);
    }
    for (size_t d = rank - 1; d-- > 0;) {  // next index of the outer dimensions
      base += steps[d];
      if (++index[d] < dims[d]) break;
      base -= steps[d] * dims[d];
      index[d] = 0;
    }
  }
  return Status::OK();
}

}  // namespace loadstone::convert
