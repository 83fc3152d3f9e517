// Which tensors belong to a quantized weight (Checkpoint::Float8Scales, Companions,
// Dequantizes): the catalog's one rule, asked by every consumer.
#include <fmt/format.h>

#include "loadstone/checkpoint.h"

namespace loadstone {

const TensorInfo* Checkpoint::Float8Scales(const TensorInfo& weight) const {
  if (weight.dtype != DType::kF8E4M3 && weight.dtype != DType::kF8E5M2) return nullptr;
  const TensorInfo* scales = Find(weight.name + "_scale_inv");
  return scales ? scales : Find(weight.name + "_scale");
}

Result<std::vector<const TensorInfo*>> Checkpoint::Companions(const TensorInfo& weight) const {
  std::vector<const TensorInfo*> out;
  if (weight.packed) {
    for (const std::string& name : weight.packed->companions()) {
      const TensorInfo* companion = Find(name);
      if (companion == nullptr) {
        return Status::InvalidArgument(fmt::format(
            "tensor '{}' is {}-packed, but its quant-state tensor '{}' is not in the checkpoint; "
            "list it beside the weight",
            weight.name, weight.packed->scheme, name));
      }
      out.push_back(companion);
    }
  } else if (const TensorInfo* scales = Float8Scales(weight)) {
    out.push_back(scales);
  }
  return out;
}

bool Checkpoint::Dequantizes(const TensorInfo& weight) const {
  return weight.packed.has_value() || Float8Scales(weight) != nullptr;
}

}  // namespace loadstone
