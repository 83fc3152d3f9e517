#include "runtime/pipeline/placer.h"

#include <cstring>

#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/convert/packed_int.h"
#include "runtime/convert/relayout.h"

namespace loadstone::pipeline {

convert::Fp8BlockScales Placer::Fp8Layout(uint32_t t, const std::byte* scales) const {
  const TensorPlan& tp = plan_.tensors[t];
  const uint64_t cols = checkpoint_.tensors()[tp.source].shape.at(1);
  return {scales, cols, tp.block_rows, tp.block_cols, (cols + tp.block_cols - 1) / tp.block_cols,
          plan_.tensors[tp.scale].dtype};
}

Status Placer::PlaceShared(const ReadChunk& read, std::byte* buffer,
                           const std::byte* staged) const {
  if (destinations_.Fresh(read.tensors.front())) {
    return destinations_.fresh_pages().Write(buffer, staged, read.length);
  }
  std::memcpy(buffer, staged, read.length);
  return Status::OK();
}

Status Placer::Relayout(uint32_t t, const std::byte* from, uint64_t lo, uint64_t hi,
                        std::vector<std::byte>* plain) const {
  const TensorInfo& src = checkpoint_.tensors()[plan_.tensors[t].source];
  const uint64_t elem = DTypeBits(src.dtype) / 8;
  const bool whole = lo == src.offset && hi == src.offset + src.nbytes;
  if ((!src.strides.empty() && !whole) || (lo - src.offset) % elem || (hi - lo) % elem) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': the plan reads a piece [{}, {}) that is not whole elements of its {} "
        "layout (a plan not made by Plan()?)", src.name,
        lo, hi, src.strides.empty() ? "big-endian" : "strided"));
  }
  const std::vector<uint64_t> piece_shape = {(hi - lo) / elem};
  const bool strided = !src.strides.empty();
  plain->resize(strided ? src.numel() * elem : hi - lo);
  return convert::Relayout(from, hi - lo, strided ? std::span<const uint64_t>(src.shape) : piece_shape,
                           src.strides, elem, src.big_endian, plain->data());
}

Status Placer::PlaceOnCpu(uint32_t t, std::byte* data, const std::byte* scales,
                          const std::byte* from, uint64_t lo, uint64_t hi) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  std::vector<std::byte> plain;
  if (!src.plain_layout()) {  // then on as the piece of a contiguous tensor it became
    LOADSTONE_RETURN_IF_ERROR(Relayout(t, from, lo, hi, &plain));
    from = plain.data();
    hi = lo + plain.size();
  }
  const bool fresh = destinations_.Fresh(t);
  // Writes `count` output units of `unit` bytes at `to`, produce(out, at, n) making units
  // at .. at + n: straight into the memory, or through fresh pages a block at a time.
  auto write_units = [&](std::byte* to, uint64_t count, uint64_t unit, const auto& produce) {
    if (!fresh) return produce(to, 0, count);
    return destinations_.fresh_pages().WriteConverted(
        to, count * unit, [&](std::byte* out, uint64_t offset, uint64_t n) {
          return produce(out, offset / unit, n / unit);
        });
  };
  if (tp.conversion == Conversion::kDequantBlocks) {
    LOADSTONE_ASSIGN_OR_RETURN(const Blocks b, BlocksOf(t, lo, hi));
    return write_units(data + b.first * b.out_bytes, b.count, b.out_bytes,
                       [&](std::byte* out, uint64_t at, uint64_t count) {
                         return convert::DequantGgufBlocks(src.packed->scheme, tp.dtype,
                                                           from + at * b.in_bytes, out, count);
                       });
  }
  if (DecodesWithState(tp.conversion)) {
    const auto elements = ElementsOf(t, lo, hi);  // not bound by name: a lambda captures it
    const uint64_t first = elements.first, count = elements.second;
    const uint64_t out_elem = DTypeBits(tp.dtype) / 8;
    return write_units(data + first * out_elem, count, out_elem,
                       [&](std::byte* out, uint64_t at, uint64_t n) {
                         return DecodeElements(t, scales, from, first, first + at, n, out);
                       });
  }
  if (tp.conversion == Conversion::kNone || tp.conversion == Conversion::kRelayout) {
    std::byte* to = data + (lo - src.offset);
    if (fresh) return destinations_.fresh_pages().Write(to, from, hi - lo);
    std::memcpy(to, from, hi - lo);
    return Status::OK();
  }
  const uint64_t src_elem = DTypeBits(src.dtype) / 8, dst_elem = DTypeBits(tp.dtype) / 8;
  const uint64_t first = (lo - src.offset) / src_elem;
  // Converts `count` elements starting `at` elements into this piece.
  auto convert = [&](std::byte* to, uint64_t at, uint64_t count) {
    const std::byte* in = from + at * src_elem;
    return tp.conversion == Conversion::kDequantFp8Block
               ? convert::DequantFp8Block(src.dtype, tp.dtype, in, to, first + at, count,
                                          Fp8Layout(t, scales))
               : convert::CastBuffer(src.dtype, tp.dtype, in, to, count);
  };
  return write_units(data + first * dst_elem, (hi - lo) / src_elem, dst_elem, convert);
}

Result<Placer::Blocks> Placer::BlocksOf(uint32_t t, uint64_t lo, uint64_t hi) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  Blocks b;
  b.in_bytes = src.packed->block_bytes;
  b.out_bytes = uint64_t{src.packed->block_elems} * (DTypeBits(tp.dtype) / 8);
  if (b.in_bytes == 0 || (lo - src.offset) % b.in_bytes != 0 || (hi - lo) % b.in_bytes != 0) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}': the plan reads a piece [{}, {}) that is not whole {} blocks (a plan not made "
        "by Plan()?)", src.name, lo, hi, src.packed->scheme));
  }
  b.first = (lo - src.offset) / b.in_bytes;
  b.count = (hi - lo) / b.in_bytes;
  return b;
}

Status Placer::Dequantize(uint32_t t, const std::byte* scales, const std::byte* from, uint64_t lo,
                          uint64_t hi, std::vector<std::byte>* out) const {
  const TensorPlan& tp = plan_.tensors[t];
  if (tp.conversion != Conversion::kDequantBlocks) {  // bitsandbytes, compressed-tensors
    const auto [first, count] = ElementsOf(t, lo, hi);
    out->resize(count * (DTypeBits(tp.dtype) / 8));
    return DecodeElements(t, scales, from, first, first, count, out->data());
  }
  LOADSTONE_ASSIGN_OR_RETURN(const Blocks b, BlocksOf(t, lo, hi));
  out->resize(b.count * b.out_bytes);
  return convert::DequantGgufBlocks(checkpoint_.tensors()[tp.source].packed->scheme, tp.dtype, from,
                                    out->data(), b.count);
}

device::PlaceJob Placer::DequantizedJob(uint32_t t, std::byte* data,
                                        const std::vector<std::byte>& decoded, uint64_t lo) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  const uint64_t out_elem = DTypeBits(tp.dtype) / 8;
  const uint64_t first = tp.conversion == Conversion::kDequantBlocks
                             ? (lo - src.offset) / src.packed->block_bytes * src.packed->block_elems
                             : ElementsOf(t, lo, lo).first;
  device::PlaceJob job;
  job.src = decoded.data();
  job.bytes = job.count = decoded.size();
  job.from = job.to = DType::kU8;  // a copy of what the worker decoded
  job.dst = data + first * out_elem;
  return job;
}

Status Placer::DecodeElements(uint32_t t, const std::byte* scales, const std::byte* piece,
                         uint64_t piece_first, uint64_t e, uint64_t n, std::byte* out) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  if (tp.conversion == Conversion::kDequantPackedInt) {
    const PackedIntState& state = *src.packed->packed_int;
    return convert::DequantPackedInt(state, tp.dtype, piece, convert::WordOf(state, piece_first), e,
                                     n, scales, out);
  }
  if (tp.conversion == Conversion::kDequantBnb8) {
    return convert::DequantBnbInt8(tp.dtype, piece + (e - piece_first), e, n, src.shape[1], scales,
                                   out);
  }
  return convert::DequantBnb4(*src.packed, tp.dtype, piece + (e - piece_first) / 2, e, n, scales,
                              out);
}

std::pair<uint64_t, uint64_t> Placer::ElementsOf(uint32_t t, uint64_t lo, uint64_t hi) const {
  const TensorInfo& src = checkpoint_.tensors()[plan_.tensors[t].source];
  if (plan_.tensors[t].conversion == Conversion::kDequantBnb8) return {lo - src.offset, hi - lo};
  if (plan_.tensors[t].conversion == Conversion::kDequantPackedInt) {  // whole 32-bit words
    uint64_t first = 0, end = 0;
    convert::ElementsOfWords(*src.packed->packed_int, (lo - src.offset) / 4, (hi - src.offset) / 4,
                             &first, &end);
    return {first, end > first ? end - first : 0};
  }
  const uint64_t first = (lo - src.offset) * 2;  // two 4-bit codes a byte, the last maybe a pad
  return {first, std::min((hi - lo) * 2, src.element_count() - first)};
}

Result<device::PlaceJob> Placer::QuantJob(const ReadChunk& read, uint32_t t, std::byte* data,
                                          const std::byte* staged,
                                          std::shared_ptr<const device::QuantDecode> quant) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  const auto [lo, hi] = PieceOf(read, src);
  device::PlaceJob job;
  if (tp.conversion == Conversion::kDequantBlocks) {
    LOADSTONE_ASSIGN_OR_RETURN(const Blocks b, BlocksOf(t, lo, hi));
    job.first = b.first * src.packed->block_elems;
    job.count = b.count * src.packed->block_elems;
  } else {
    std::tie(job.first, job.count) = ElementsOf(t, lo, hi);
  }
  job.src = staged + (lo - read.offset);
  job.bytes = hi - lo;
  job.from = src.dtype;
  job.to = tp.dtype;
  job.dst = data + job.first * (DTypeBits(tp.dtype) / 8);
  job.quant = std::move(quant);
  return job;
}

device::PlaceJob Placer::DeviceJob(const ReadChunk& read, uint32_t t, std::byte* data,
                                   const std::byte* scales, const std::byte* staged) const {
  const auto [lo, hi] = PieceOf(read, checkpoint_.tensors()[plan_.tensors[t].source]);
  return DeviceJobFrom(t, data, scales, staged + (lo - read.offset), lo, hi);
}

device::PlaceJob Placer::DeviceJobFrom(uint32_t t, std::byte* data, const std::byte* scales,
                                       const std::byte* from, uint64_t lo, uint64_t hi) const {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  const uint64_t src_elem = DTypeBits(src.dtype) / 8, dst_elem = DTypeBits(tp.dtype) / 8;
  device::PlaceJob job;
  job.src = from;
  job.bytes = hi - lo;
  job.from = src.dtype;
  job.to = tp.dtype;
  job.count = src_elem ? (hi - lo) / src_elem : 0;
  job.dst = data + (src_elem ? (lo - src.offset) / src_elem * dst_elem : lo - src.offset);
  if (tp.conversion == Conversion::kNone || tp.conversion == Conversion::kRelayout) {
    job.from = job.to = DType::kU8, job.count = job.bytes;
  }
  if (tp.conversion == Conversion::kDequantFp8Block) {
    job.fp8 = Fp8Layout(t, scales);
    job.first = (lo - src.offset) / src_elem;
  }
  return job;
}

}  // namespace loadstone::pipeline
