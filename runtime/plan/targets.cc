#include "runtime/plan/targets.h"

#include <fmt/format.h>

#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/gguf_blocks.h"

namespace loadstone::planning {

uint64_t PlacedElements(const TensorInfo& t, Conversion conversion) {
  return Unpacks(conversion) ? t.element_count() : t.numel();
}

Conversion DequantOf(const TensorInfo& t, DType to) {
  Conversion decodes = Conversion::kDequantBlocks;
  bool can = convert::CanDequantBnb4(to);  // bitsandbytes and compressed-tensors: f32/f16/bf16
  if (t.packed->bnb4) {
    decodes = Conversion::kDequantBnb4;
  } else if (t.packed->bnb8) {
    decodes = Conversion::kDequantBnb8;
  } else if (t.packed->packed_int) {
    decodes = Conversion::kDequantPackedInt;
  } else {
    can = convert::CanDequantGguf(t.packed->scheme, to);
  }
  return can ? decodes : Conversion::kNone;
}

namespace {

Result<Target> TargetOf(const TensorInfo& t, const PlanOptions& options) {
  Target out{t.dtype, Conversion::kNone};
  std::optional<DType> target;
  if (auto special = options.special_dtypes.find(t.name); special != options.special_dtypes.end()) {
    if (t.packed && DequantOf(t, special->second) == Conversion::kNone) {
      return Status::InvalidArgument(fmt::format(
          "special dtype {} for tensor '{}' ({}-packed): loadstone dequantizes {} into f32, f16 "
          "or bf16 only",
          TorchName(special->second), t.name, t.packed->scheme, kDecodable));
    }
    if (!t.packed && !convert::CanCast(t.dtype, special->second)) {
      return Status::InvalidArgument(fmt::format(
          "special dtype {} for tensor '{}' ({}): loadstone casts f32, f16, bf16, f64 and "
          "float8 tensors to f32, f16 or bf16 only",
          TorchName(special->second), t.name, TorchName(t.dtype)));
    }
    target = special->second;
  } else if (options.dtype && (IsFloatingPoint(t.dtype) || t.packed)) {
    target = *options.dtype;
    if (IsReducedFloat(*target)) {
      for (const std::string& pattern : options.keep_in_fp32) {
        if (MatchesModulePattern(t.name, pattern)) target = DType::kF32;
      }
    }
  }
  if (t.packed) {  // dequantized when it can be, else as stored (Plan warns)
    if (target && !options.keep_packed && t.packed->bnb8 && t.packed->bnb8->weight_format != 0) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is an LLM.int8 weight in bitsandbytes' weight_format {} (a GPU tile layout, "
          "not \"row\"): loadstone dequantizes row-format weights only; save it from bitsandbytes "
          "in row format, or keep it packed (keep_packed, --keep-packed)",
          t.name, t.packed->bnb8->weight_format));
    }
    if (target && !options.keep_packed && DequantOf(t, *target) != Conversion::kNone) {
      out = {*target, DequantOf(t, *target)};
    }
    return out;
  }
  if (target && *target != t.dtype && convert::CanCast(t.dtype, *target)) {
    out = {*target, Conversion::kCast};
  } else if (!t.plain_layout()) {
    out.conversion = Conversion::kRelayout;
  }
  return out;
}

}  // namespace

Result<std::vector<Target>> Targets(const std::vector<TensorInfo>& infos,
                                    const PlanOptions& options,
                                    const std::map<size_t, ScalePair>& scale_pairs,
                                    const std::vector<bool>& keep_stored) {
  PlanOptions as_stored = options;
  as_stored.dtype.reset();
  as_stored.special_dtypes
      .clear();  // a scale or quant-state tensor is read as it is, whatever asked
  std::vector<Target> targets(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    LOADSTONE_ASSIGN_OR_RETURN(targets[i],
                               TargetOf(infos[i], keep_stored[i] ? as_stored : options));
    if (scale_pairs.contains(i) && !infos[i].packed && targets[i].conversion != Conversion::kNone) {
      targets[i].conversion = Conversion::kDequantFp8Block;
    }
  }
  return targets;
}

}  // namespace loadstone::planning
