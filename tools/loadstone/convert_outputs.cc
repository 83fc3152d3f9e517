#include "tools/loadstone/convert_outputs.h"

#include <string>
#include <utility>

#include <fmt/format.h>

namespace loadstone::cli {
namespace {

// Unsupported: packed tensor `t` would be written as its bytes alone, which lose its type.
Status PackedWithoutType(const TensorInfo& t, const PlanOptions& options) {
  return Status::Unsupported(fmt::format(
      "tensor '{}' is {}-packed, which {}: safetensors has no dtype for GGUF blocks, so "
      "written as bytes it would lose its type; {}",
      t.name, t.packed->scheme,
      options.dtype ? "loadstone does not dequantize" : "--dtype would dequantize",
      options.dtype ? "convert a checkpoint of types it decodes"
                    : "give --dtype f32, f16 or bf16"));
}

}  // namespace

Result<TensorFates> DecideFates(const Checkpoint& ckpt, const LoadPlan& whole,
                                const PlanOptions& options) {
  const size_t count = ckpt.tensors().size();
  TensorFates fates{std::vector<DType>(count), std::vector<bool>(count), std::vector<bool>(count),
                    std::vector<const TensorInfo*>(count)};
  for (const TensorPlan& tp : whole.tensors) {
    const TensorInfo& t = ckpt.tensors()[tp.source];
    fates.out_dtype[tp.source] = tp.dtype;
    fates.decoded[tp.source] = Unpacks(tp.conversion);
    // A quantized tensor is written dequantized (its companions, quant state or float8 scales,
    // then belong to nothing), or as stored with them — unless its bytes alone would lose what
    // they are (GGUF).
    LOADSTONE_ASSIGN_OR_RETURN(const auto companions, ckpt.Companions(t));
    if (fates.decoded[tp.source] || tp.conversion == Conversion::kDequantFp8Block) {
      for (const TensorInfo* c : companions) {
        fates.dropped[static_cast<size_t>(c - ckpt.tensors().data())] = true;
      }
    }
    if (!fates.decoded[tp.source] && t.packed && companions.empty()) {
      return PackedWithoutType(t, options);
    }
    // A scaled float8 weight is written dequantized, whole, loaded with the scales its plan
    // pairs it with.
    if (tp.conversion == Conversion::kDequantFp8Block) {
      fates.scales_of[tp.source] = &ckpt.tensors()[whole.tensors[tp.scale].source];
    }
  }
  return fates;
}

ConvertOutputs ListOutputs(const Checkpoint& ckpt, const TensorFates& fates,
                           ConvertFeeder& feeder, std::function<void()> after_fill) {
  ConvertOutputs outputs;
  for (size_t i = 0; i < ckpt.tensors().size(); ++i) {
    const TensorInfo& t = ckpt.tensors()[i];
    if (fates.dropped[i]) continue;
    const bool decoded = fates.decoded[i];
    // A dequantized weight under the name a model gives it ("M.weight" for "M.weight_packed").
    const std::string& name = decoded ? t.decoded_name() : t.name;
    TensorToWrite w{name, fates.out_dtype[i], decoded ? t.packed->element_shape : t.shape, {}, {}};
    outputs.source_of.push_back(i);
    w.fill = [&feeder, after_fill, i](uint64_t offset, std::span<std::byte> chunk) {
      Status s = feeder.Fill(i, offset, chunk);
      after_fill();
      return s;
    };
    outputs.total += w.nbytes();
    outputs.tensors.push_back(std::move(w));
  }
  return outputs;
}

void LayOutFeeder(const Checkpoint& ckpt, const TensorFates& fates,
                  const ConvertOutputs& outputs, bool one_file, uint64_t max_shard,
                  ConvertFeeder& feeder) {
  std::vector<std::vector<size_t>> shards =
      one_file ? std::vector<std::vector<size_t>>{{}} : SplitIntoShards(outputs.tensors, max_shard);
  if (one_file) {
    for (size_t i = 0; i < outputs.tensors.size(); ++i) shards[0].push_back(i);
  }
  for (const auto& shard : shards) {
    std::vector<TensorToWrite> in_shard;
    for (size_t i : shard) in_shard.push_back(outputs.tensors[i]);
    for (size_t k : LayoutOrder(in_shard)) {
      const size_t i = outputs.source_of[shard[k]];
      feeder.AddTensor(i, ckpt.tensors()[i], outputs.tensors[shard[k]].nbytes(),
                       fates.decoded[i], fates.scales_of[i]);
    }
  }
  feeder.Seal();
}

}  // namespace loadstone::cli
