#include "runtime/plan/check_plan.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/plan/schedule.h"

namespace loadstone::planning {
namespace {

__extension__ using Wide = unsigned __int128;

Status Refused(std::string_view what) {
  return Status::InvalidArgument(
      fmt::format("this plan cannot be loaded: {}; plan it again with Plan()", what));
}

bool IsFloat8(DType d) { return d == DType::kF8E4M3 || d == DType::kF8E5M2; }

// A float8 weight's scales: where they are, their block and how many of them it needs.
Status CheckFp8(const Checkpoint& checkpoint, const LoadPlan& plan, const TensorPlan& tp) {
  const TensorInfo& src = checkpoint.tensors()[tp.source];
  const TensorPlan& scales = plan.tensors[tp.scale];
  if (!IsFloat8(src.dtype) || src.shape.size() != 2 || tp.block_rows == 0 || tp.block_cols == 0 ||
      !convert::IsFp8ScaleDType(scales.dtype) || scales.conversion != Conversion::kNone ||
      scales.device != tp.device) {
    return Refused(fmt::format("tensor '{}' is dequantized with scales that do not fit it",
                               src.name));
  }
  const Wide needed = static_cast<Wide>((src.shape[0] + tp.block_rows - 1) / tp.block_rows) *
                      ((src.shape[1] + tp.block_cols - 1) / tp.block_cols) *
                      (DTypeBits(scales.dtype) / 8);
  if (needed > scales.nbytes) {
    return Refused(fmt::format("tensor '{}' needs more scales than '{}' holds", src.name,
                               checkpoint.tensors()[scales.source].name));
  }
  return Status::OK();
}

// A packed tensor that DequantGgufBlocks decodes into `dtype`, its layout the decoder's own.
bool DecodesAsPacked(const TensorInfo& src, DType dtype) {
  if (!src.packed || !convert::CanDequantGguf(src.packed->scheme, dtype)) return false;
  const convert::GgufBlockType* type = convert::FindGgufBlockType(src.packed->scheme);
  return type->block_bytes == src.packed->block_bytes && type->block_elems == src.packed->block_elems;
}

// A quantized weight's scales (bitsandbytes absmax or SCB, compressed-tensors weight_scale): the
// catalog's, as stored, in host memory (the CPU worker that decodes the weight reads them,
// whatever the weight's device).
Status CheckQuantState(const Checkpoint& checkpoint, const LoadPlan& plan, const TensorPlan& tp) {
  const TensorInfo& src = checkpoint.tensors()[tp.source];
  const TensorPlan& absmax = plan.tensors[tp.scale];
  const TensorInfo* want = checkpoint.Find(src.packed->companions().front());
  // What the decoder indexes, from the state alone (a catalog made by WithTensors can pair a
  // state with smaller tensors than the one Open checked).
  const PackedLayout& p = *src.packed;
  const uint64_t n = src.element_count();
  Wide needed = 0;
  bool tables_fit = true;
  if (p.bnb4) {
    const uint64_t blocks = p.block_elems ? (n + p.block_elems - 1) / p.block_elems : 0;
    needed = static_cast<Wide>(blocks) * (p.bnb4->nested ? 1 : 4);
    tables_fit = p.block_elems > 0 && src.nbytes >= (n + 1) / 2 &&
                 (!p.bnb4->nested || (p.bnb4->nested_blocksize > 0 &&
                                      p.bnb4->nested_absmax.size() * uint64_t{p.bnb4->nested_blocksize} >= blocks));
  } else if (p.bnb8) {
    tables_fit = src.shape.size() == 2 && src.nbytes >= n;
    needed = static_cast<Wide>(src.shape.empty() ? 0 : src.shape[0]) * 4;
  } else if (p.packed_int) {
    const PackedIntState& s = *p.packed_int;
    needed = static_cast<Wide>(s.rows) * s.groups * (DTypeBits(s.scale_dtype) / 8);
    const bool shape_fits =
        s.order == PackOrder::kRows   ? s.bits == 2 || s.bits == 4 || s.bits == 8
        : s.order == PackOrder::kGptq ? (s.bits == 2 || s.bits == 3 || s.bits == 4 ||
                                         s.bits == 8) && s.cols * s.bits % 32 == 0
                                      : s.bits == 4 && s.rows % 8 == 0;
    tables_fit = s.groups > 0 && s.group_size > 0 && s.rows * s.cols == n && shape_fits &&
                 (!s.g_idx.empty() || (s.cols + s.group_size - 1) / s.group_size <= s.groups) &&
                 src.nbytes / 4 >= s.words() &&
                 (s.zeros.empty() || s.zeros.size() == s.rows * s.groups) &&
                 (s.g_idx.empty() ||
                  (s.g_idx.size() == s.cols &&
                   std::all_of(s.g_idx.begin(), s.g_idx.end(), [&](int32_t g) {
                     return g >= 0 && static_cast<uint64_t>(g) < s.groups;
                   }))) &&
                 checkpoint.tensors()[absmax.source].dtype == s.scale_dtype;
  }
  if (!tables_fit || static_cast<Wide>(absmax.nbytes) < needed) {
    return Refused(fmt::format("tensor '{}' has a quant state that does not fit it or its scales",
                               src.name));
  }
  if (want == nullptr || &checkpoint.tensors()[absmax.source] != want ||
      absmax.conversion != Conversion::kNone || plan.targets[absmax.device] != Device::Cpu()) {
    return Refused(fmt::format("tensor '{}' is dequantized without its absmax in host memory",
                               src.name));
  }
  return Status::OK();
}

// Each planned tensor: its source, target and scales exist, it is planned once, and its size,
// dtype and conversion agree with the catalog.
Status CheckTensors(const Checkpoint& checkpoint, const LoadPlan& plan) {
  const auto& infos = checkpoint.tensors();
  std::vector<bool> planned(infos.size());
  for (const TensorPlan& tp : plan.tensors) {
    if (tp.source >= infos.size() || tp.scale >= plan.tensors.size() ||
        tp.device >= plan.targets.size()) {
      return Refused("it names a tensor, device or scales the checkpoint does not have");
    }
    const TensorInfo& src = infos[tp.source];
    if (planned[tp.source]) return Refused(fmt::format("tensor '{}' is planned twice", src.name));
    planned[tp.source] = true;
    const bool dtype_fits = tp.conversion == Conversion::kNone
                                ? tp.dtype == src.dtype && src.plain_layout()
                            : tp.conversion == Conversion::kCast
                                ? convert::CanCast(src.dtype, tp.dtype)
                            : tp.conversion == Conversion::kRelayout
                                ? tp.dtype == src.dtype && !src.plain_layout()
                            : tp.conversion == Conversion::kDequantBlocks
                                ? DecodesAsPacked(src, tp.dtype)
                            : tp.conversion == Conversion::kDequantBnb4
                                ? src.packed && src.packed->bnb4 && convert::CanDequantBnb4(tp.dtype)
                            : tp.conversion == Conversion::kDequantBnb8
                                ? src.packed && src.packed->bnb8 &&
                                      src.packed->bnb8->weight_format == 0 &&
                                      convert::CanDequantBnb4(tp.dtype)
                            : tp.conversion == Conversion::kDequantPackedInt
                                ? src.packed && src.packed->packed_int &&
                                      convert::CanDequantBnb4(tp.dtype)
                                : tp.conversion == Conversion::kDequantFp8Block;
    const uint64_t elements = Unpacks(tp.conversion) ? src.element_count() : src.numel();
    if (!dtype_fits ||
        static_cast<Wide>(tp.nbytes) * 8 != static_cast<Wide>(elements) * DTypeBits(tp.dtype)) {
      return Refused(fmt::format("tensor '{}' is planned as {} bytes of {} by {}, which its {} "
                                 "bytes of {} cannot become",
                                 src.name, tp.nbytes, TorchName(tp.dtype),
                                 ConversionName(tp.conversion), src.nbytes, TorchName(src.dtype)));
    }
    if (tp.fresh_pages && plan.targets[tp.device] != Device::Cpu()) {
      return Refused(fmt::format("tensor '{}' is in fresh pages but not on the CPU", src.name));
    }
    const bool both = tp.caller_memory && tp.pinned;
    if (tp.memory_given() && (plan.targets[tp.device] != Device::Cpu() || tp.fresh_pages || both)) {
      return Refused(fmt::format("tensor '{}' is in {} memory, but {}", src.name,
                                 tp.pinned ? "pinned" : "the caller's",
                                 tp.fresh_pages ? "also in fresh pages"
                                 : both         ? "both the caller's and pinned"
                                                : "not on the CPU"));
    }
    if (tp.conversion == Conversion::kDequantFp8Block) {
      LOADSTONE_RETURN_IF_ERROR(CheckFp8(checkpoint, plan, tp));
    }
    if (DecodesWithState(tp.conversion)) {
      LOADSTONE_RETURN_IF_ERROR(CheckQuantState(checkpoint, plan, tp));
    }
  }
  return Status::OK();
}

// A read's converted tensors: none waits for scales in its own read; a dequantized packed tensor
// is read in whole blocks (words), and whole when its rows span the tensor.
Status CheckConvertedPieces(const Checkpoint& checkpoint, const LoadPlan& plan,
                            const ReadChunk& r) {
  for (uint32_t t : r.tensors) {
    if (UsesScales(plan.tensors[t].conversion) &&
        std::find(r.tensors.begin(), r.tensors.end(), plan.tensors[t].scale) != r.tensors.end()) {
      return Refused(fmt::format("a read holds both tensor '{}' and the scales it waits for",
                                 checkpoint.tensors()[plan.tensors[t].source].name));
    }
  }
  for (uint32_t t : r.tensors) {
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
    const Conversion conversion = plan.tensors[t].conversion;
    if (conversion != Conversion::kDequantBlocks && conversion != Conversion::kDequantPackedInt) {
      continue;
    }
    const uint64_t lo = std::max(r.offset, src.offset);
    const uint64_t hi = std::min(r.offset + r.length, src.offset + src.nbytes);
    const uint64_t block = src.packed->block_bytes;
    const bool whole = conversion == Conversion::kDequantPackedInt &&
                       src.packed->packed_int && src.packed->packed_int->transposed();
    if (whole && (lo != src.offset || hi != src.offset + src.nbytes)) {
      return Refused(fmt::format("tensor '{}' ({}) is dequantized from a read of part of it; it "
                                 "is read whole",
                                 src.name, src.packed->scheme));
    }
    if (block == 0 || (lo - src.offset) % block != 0 || (hi - lo) % block != 0) {
      return Refused(fmt::format("tensor '{}' is dequantized from a read that cuts its {} blocks",
                                 src.name, src.packed->scheme));
    }
  }
  return Status::OK();
}

// A shared-buffer read: its tensors' bytes back to back in file order (gaps of at most
// kCoalesceGap), unconverted, on the CPU, in memory of one kind, and the read exactly them.
Status CheckSharedBuffer(const Checkpoint& checkpoint, const LoadPlan& plan, const ReadChunk& r) {
  const TensorInfo& first = checkpoint.tensors()[plan.tensors[r.tensors.front()].source];
  uint64_t at = r.offset;
  for (uint32_t t : r.tensors) {
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
    if (!IsUnconvertedCpu(plan, t) || plan.tensors[t].memory_given() || src.file != r.file ||
        src.offset < at ||
        src.offset - at > kCoalesceGap ||
        plan.tensors[t].fresh_pages != plan.tensors[r.tensors.front()].fresh_pages) {
      return Refused(fmt::format("the shared buffer of '{}' is not its tensors' bytes in file "
                                 "order (gaps of at most {} bytes), unconverted, on the CPU",
                                 first.name, kCoalesceGap));
    }
    at = src.offset + src.nbytes;
  }
  if (at != r.offset + r.length || r.route == ReadRoute::kMapped) {
    return Refused(fmt::format("the shared buffer of '{}' does not hold its read", first.name));
  }
  return Status::OK();
}

// The route of read `r` fits it (see the header).
Status CheckRoute(const Checkpoint& checkpoint, const LoadPlan& plan, const ReadChunk& r) {
  const auto route = static_cast<size_t>(r.route);
  if (route >= kReadRouteCount || r.route == ReadRoute::kPageCacheCopy) {
    return Refused("a read has a route that cannot be planned");
  }
  const TensorInfo& first = checkpoint.tensors()[plan.tensors[r.tensors.front()].source];
  LOADSTONE_RETURN_IF_ERROR(CheckConvertedPieces(checkpoint, plan, r));
  if (r.shared_buffer) {
    LOADSTONE_RETURN_IF_ERROR(CheckSharedBuffer(checkpoint, plan, r));
  } else if (r.route != ReadRoute::kStaged &&
             (r.tensors.size() != 1 || !IsUnconvertedCpu(plan, r.tensors.front()))) {
    return Refused(fmt::format("tensor '{}' is read {}, but it is converted, on a device or read "
                               "with others",
                               first.name, ReadRouteName(r.route)));
  }
  const bool fresh = plan.tensors[r.tensors.front()].fresh_pages;
  if (r.route == ReadRoute::kMapped && !plan.routes.mmap) {
    return Refused(fmt::format("tensor '{}' is mapped without ReadRouteOptions::mmap", first.name));
  }
  if (r.route == ReadRoute::kMapped && plan.tensors[r.tensors.front()].memory_given()) {
    return Refused(fmt::format("tensor '{}' is mapped, but its memory is given (caller's or pinned)",
                               first.name));
  }
  if ((r.route == ReadRoute::kFreshPages) != (fresh && r.route != ReadRoute::kStaged)) {
    return Refused(fmt::format("tensor '{}' is read {} into {}", first.name,
                               ReadRouteName(r.route), fresh ? "fresh pages" : "ordinary memory"));
  }
  return Status::OK();
}

// Every planned tensor's bytes are read exactly once, in file order, by reads inside its file.
Status CheckCoverage(const Checkpoint& checkpoint, const LoadPlan& plan) {
  std::vector<uint64_t> next(plan.tensors.size());  // per tensor: the offset its next piece starts at
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    next[t] = checkpoint.tensors()[plan.tensors[t].source].offset;
  }
  for (const ReadChunk& r : plan.reads) {
    if (r.file >= checkpoint.files().size() || r.tensors.empty() || r.length == 0 ||
        r.offset > checkpoint.files()[r.file].bytes ||
        r.length > checkpoint.files()[r.file].bytes - r.offset) {
      return Refused("a read is empty or outside its file");
    }
    for (uint32_t t : r.tensors) {
      if (t >= plan.tensors.size()) return Refused("a read is for a tensor the plan does not have");
    }
    LOADSTONE_RETURN_IF_ERROR(CheckRoute(checkpoint, plan, r));
    for (uint32_t t : r.tensors) {
      const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
      const uint64_t lo = std::max(r.offset, src.offset);
      const uint64_t hi = std::min(r.offset + r.length, src.offset + src.nbytes);
      if (src.file != r.file || lo >= hi || lo != next[t]) {
        return Refused(fmt::format("the bytes of tensor '{}' are not read exactly once, in order",
                                   src.name));
      }
      if (!src.strides.empty() && (lo != src.offset || hi != src.offset + src.nbytes)) {
        return Refused(fmt::format("strided tensor '{}' is not read in one piece", src.name));
      }
      next[t] = hi;
    }
  }
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorInfo& src = checkpoint.tensors()[plan.tensors[t].source];
    if (next[t] != src.offset + src.nbytes) {
      return Refused(fmt::format("the bytes of tensor '{}' are not read exactly once, in order",
                                 src.name));
    }
  }
  return Status::OK();
}

}  // namespace

Status CheckPlanFor(const Checkpoint& checkpoint, const LoadPlan& plan) {
  if (plan.checkpoint_fingerprint != checkpoint.fingerprint()) {
    return Status::InvalidArgument(fmt::format(
        "this plan was made for another checkpoint (fingerprint {:016x}, the checkpoint's "
        "{:016x}: other files, sizes or tensors, or a plan not made by Plan()); plan it again "
        "with Plan() for this checkpoint ({})",
        plan.checkpoint_fingerprint, checkpoint.fingerprint(),
        checkpoint.files().empty() ? std::string("no files") : checkpoint.files()[0].path));
  }
  LOADSTONE_RETURN_IF_ERROR(CheckTensors(checkpoint, plan));
  LOADSTONE_RETURN_IF_ERROR(CheckCoverage(checkpoint, plan));
  LOADSTONE_RETURN_IF_ERROR(CheckMemory(checkpoint, plan));
  return CheckConversionSites(checkpoint, plan);
}

}  // namespace loadstone::planning
