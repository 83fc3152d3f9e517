#include "runtime/convert/fp8_block.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "runtime/convert/buffer_map.h"

namespace loadstone::convert {
namespace {

// One run of codes that share `scale` (f32 bits; a piece of one row inside one block).
using RunKernel = void (*)(const std::byte*, std::byte*, uint64_t, uint32_t, DType);

template <bool kE5M2, typename Out, Out (*Encode)(uint32_t)>
LOADSTONE_CLONES void Run(const std::byte* src, std::byte* dst, uint64_t count, uint32_t scale,
                          DType scale_dtype) {
  Map<uint8_t, Out>(src, dst, count, [scale, scale_dtype](uint8_t q) {
    return Encode(Fp8ScaledF32Bits(q, kE5M2, scale, scale_dtype));
  });
}

constexpr uint32_t Identity(uint32_t f) { return f; }

template <bool kE5M2>
RunKernel FindRun(DType to) {
  switch (to) {
    case DType::kF32:
      return Run<kE5M2, uint32_t, Identity>;
    case DType::kF16:
      return Run<kE5M2, uint16_t, F32ToF16Bits>;
    case DType::kBF16:
      return Run<kE5M2, uint16_t, F32ToBF16Bits>;
    default:
      return nullptr;
  }
}

RunKernel FindRun(DType from, DType to) {
  if (from == DType::kF8E4M3) return FindRun<false>(to);
  if (from == DType::kF8E5M2) return FindRun<true>(to);
  return nullptr;
}

}  // namespace

bool CanDequantFp8Block(DType from, DType to) { return FindRun(from, to) != nullptr; }

Status DequantFp8Block(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t first,
                       uint64_t count, const Fp8BlockScales& layout) {
  const RunKernel run = FindRun(from, to);
  if (run == nullptr) {
    return Status::InvalidArgument(
        fmt::format("cannot dequantize {} blocks to {}", TorchName(from), TorchName(to)));
  }
  if (!IsFp8ScaleDType(layout.scale_dtype)) {
    return Status::InvalidArgument(fmt::format("fp8 block scales of {}: only float32, bfloat16 "
                                               "and float16 scales are supported",
                                               TorchName(layout.scale_dtype)));
  }
  if (layout.cols == 0 || layout.block_rows == 0 || layout.block_cols == 0 ||
      layout.scale_cols != (layout.cols + layout.block_cols - 1) / layout.block_cols) {
    return Status::InvalidArgument(fmt::format(
        "fp8 block layout: {} columns in blocks of {} x {} need {} scales per row, not {}",
        layout.cols, layout.block_rows, layout.block_cols,
        layout.block_cols ? (layout.cols + layout.block_cols - 1) / layout.block_cols : 0,
        layout.scale_cols));
  }
  const uint64_t out_bytes = DTypeBits(to) / 8;
  const uint64_t scale_bytes = DTypeBits(layout.scale_dtype) / 8;
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t row = e / layout.cols, col = e % layout.cols;
    // The run ends at the block's right edge, the row's end, or the buffer's end.
    const uint64_t block_end =
        std::min(layout.cols, (col / layout.block_cols + 1) * layout.block_cols);
    const uint64_t n = std::min(block_end - col, end - e);
    uint32_t raw = 0;  // little-endian: the scale's bytes in the low end
    const uint64_t s = (row / layout.block_rows) * layout.scale_cols + col / layout.block_cols;
    std::memcpy(&raw, layout.scales + s * scale_bytes, scale_bytes);
    run(src + (e - first), dst + (e - first) * out_bytes, n,
        Fp8ScaleToF32Bits(raw, layout.scale_dtype), layout.scale_dtype);
    e += n;
  }
  return Status::OK();
}

}  // namespace loadstone::convert
