// Pipeline-parallel stages as vLLM cuts a decoder stack: which layers stage s of P holds
// (vllm.distributed.utils.get_pp_indices: even, the remainder to the stages before the last, or
// the counts given as VLLM_PP_LAYER_PARTITION gives them), and which stage holds each tensor —
// a layer's tensors on the stage of its layer, the embeddings on the first stage (and the last
// when the head is tied to them), every other tensor (final norm, head) on the last. Pure
// functions.
#ifndef LOADSTONE_RUNTIME_PLAN_PP_RULES_H_
#define LOADSTONE_RUNTIME_PLAN_PP_RULES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstone/status.h"

namespace loadstone::planning {

// Layers [first, end) of each of `pp` stages of a stack of `layers`: `counts` (one per stage,
// adding up to `layers`) when given, else layers / pp each and the remainder one each to the
// stages before the last, the nearest to it first. Errors: InvalidArgument (pp < 1, counts of
// another length or sum, a negative count), naming what to give.
Result<std::vector<std::pair<int, int>>> PpLayerRanges(int layers, int pp,
                                                       std::span<const int> counts);

// The layer a tensor belongs to: its name's first component that is a decimal number
// ("model.layers.12.mlp.up_proj.weight" → 12, "transformer.h.3.attn.c_attn.weight" → 3); none for
// a tensor outside the stack (embeddings, final norm, head).
std::optional<int> LayerOf(std::string_view name);

// The stack a numbered tensor is in: its name up to its first number ("model.layers.12.mlp.w" →
// "model.layers.", "model.visual.blocks.3.attn.qkv.weight" → "model.visual.blocks."); empty for a
// name without a number.
std::string_view StackOf(std::string_view name);

// An embedding of the stack's input: a name component "embed_tokens", "embed_positions",
// "wte", "wpe", "word_embeddings" or "embeddings".
bool IsInputEmbedding(std::string_view name);

// A name component of a multi-token-prediction stack kept apart ("mtp" of "mtp.layers.0",
// "mtp_layers" of "model.mtp_layers.0"): "mtp", or one starting with "mtp_".
bool IsMtpComponent(std::string_view part);

// What the stages need of a checkpoint: the decoder stack, its length, the multi-token-prediction
// layers stored after it, and whether the head is the input embedding (tied).
struct PpModel {
  int layers = 0;
  bool tied = false;
  std::string stack;  // the decoder's StackOf ("model.layers."); empty: every numbered tensor
  int mtp = 0;        // layers [layers, layers + mtp) (DeepSeek's MTP layer 61): the last stage
  // Where the other stacks' tensors start ("model.visual."): an encoder, on the first stage.
  std::vector<std::string> encoders;
};

// From config.json (`num_hidden_layers`, else `text_config.num_hidden_layers`;
// `num_nextn_predict_layers`; `tie_word_embeddings`; empty text: no config) and the tensors'
// names: the decoder stack is the stack whose distinct layer numbers count the config's layers
// (with or without its MTP layers), the one of most tensors among those or without a config; the
// layer count is the config's, else one past the stack's highest layer; tied is the config's,
// else whether no tensor is named "lm_head.weight". Tensors of another stack (a vision tower's
// blocks) are not decoder layers; a stack named "mtp…" is never the decoder's. Errors:
// InvalidArgument (a config that is not an object or holds a bad value; a decoder tensor of a
// layer past the config's count and its MTP layers), naming the file.
Result<PpModel> PpModelOf(std::string_view config_json, std::span<const std::string> names);

// Whether stage `stage` of the ranges' holds tensor `name`: a decoder layer's on the stage of its
// layer (an MTP layer on the last, in the decoder's stack or one of its own); the input
// embeddings and everything under another stack's root (an encoder whose output the first layer
// takes: "model.visual." of "model.visual.blocks.3") on the first stage, the embeddings on the
// last too when tied; every other tensor on the last.
bool OnStage(std::string_view name, const PpModel& model,
             std::span<const std::pair<int, int>> ranges, int stage);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_PP_RULES_H_
