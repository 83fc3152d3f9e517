// The order a load reads a checkpoint's tensors in (PlanOptions::order, plan.h) and the modules
// that order cuts the plan into (LoadPlan::modules): what lets a serving engine start on the first
// layers while the rest still streams (LoadHandle::Module, Prioritize; docs/pipeline.md).
#ifndef LOADSTONE_PLAN_ORDER_H_
#define LOADSTONE_PLAN_ORDER_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace loadstone {

// The order a load reads its tensors in (PlanOptions::order; docs/pipeline.md, "Execution
// order"). Reads of one module stay together and in file order, so the reader still coalesces
// and keeps its queue deep.
enum class TensorOrder : uint8_t {
  // The order the model runs in, module by module, by the rules of Hugging Face architectures
  // on the names: the inputs (embeddings; diffusers' image, then time, then text embeddings),
  // then layers 0 … N-1, then the final norm, then the head; encoders (a vision tower) before
  // the decoder; diffusers' down → mid → up blocks, double before single transformer blocks;
  // multi-token-prediction layers (DeepSeek's, config.json num_nextn_predict_layers) last.
  // Modules the rules do not place keep the registration order of the module tree
  // PlanOptions::model gives (a model description, a live torch::nn::Module), else natural name
  // order ("layers.2" before "layers.10"). The default.
  kExecution,
  // As stored: shard by shard, each file front to back (safetensors sorts names: "layers.10"
  // before "layers.2", "lm_head" before "model.").
  kFile,
  // PlanOptions::order_prefixes first, in their order (a tensor under several goes with the
  // longest), then every other tensor in execution order.
  kGiven,
};
std::string_view TensorOrderName(TensorOrder order);  // "execution", "file", "given"

// A module of the plan's order (LoadPlan::modules): tensors [first, end) of LoadPlan::tensors,
// all named `prefix` or under it (a layer "model.layers.3", "model.embed_tokens", or a prefix of
// PlanOptions::order_prefixes).
struct PlanModule {
  std::string prefix;
  uint32_t first = 0;
  uint32_t end = 0;
};

}  // namespace loadstone

#endif  // LOADSTONE_PLAN_ORDER_H_
