// Pipeline stages (runtime/plan/pp_rules.h) against vLLM's: the expected layer ranges are the
// goldens of vLLM's own tests/distributed/test_pipeline_partition.py (its automatic split of 2..5
// layers over 2 and 3 stages, and its VLLM_PP_LAYER_PARTITION cases), copied here as data.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/plan/pp_rules.h"

namespace loadstone::planning {
namespace {

using Ranges = std::vector<std::pair<int, int>>;

Ranges Split(int layers, int pp, std::vector<int> counts = {}) {
  auto ranges = PpLayerRanges(layers, pp, counts);
  REQUIRE(ranges.ok());
  return *ranges;
}

TEST_CASE("pipeline stages: layers split as vLLM's get_pp_indices splits them") {
  CHECK(Split(2, 2) == Ranges{{0, 1}, {1, 2}});
  CHECK(Split(3, 2) == Ranges{{0, 2}, {2, 3}});
  CHECK(Split(3, 3) == Ranges{{0, 1}, {1, 2}, {2, 3}});
  CHECK(Split(4, 3) == Ranges{{0, 1}, {1, 3}, {3, 4}});
  CHECK(Split(5, 3) == Ranges{{0, 2}, {2, 4}, {4, 5}});
  // Given counts (VLLM_PP_LAYER_PARTITION, --pp-layers).
  CHECK(Split(20, 4, {5, 5, 5, 5}) == Ranges{{0, 5}, {5, 10}, {10, 15}, {15, 20}});
  CHECK(Split(20, 4, {4, 6, 6, 4}) == Ranges{{0, 4}, {4, 10}, {10, 16}, {16, 20}});
  CHECK(Split(22, 4, {5, 6, 5, 6}) == Ranges{{0, 5}, {5, 11}, {11, 16}, {16, 22}});
  // More stages than layers: the last stages hold none (and the last still the norm and head).
  CHECK(Split(2, 3) == Ranges{{0, 1}, {1, 2}, {2, 2}});
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{{5, 5, 5}, {5, 5, 5, 6},
                                                                   {10, 10, 5, -5}}) {
    auto ranges = PpLayerRanges(20, 4, bad);
    REQUIRE_FALSE(ranges.ok());
    CHECK(ranges.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(ranges.status().message()), Catch::Contains("--pp-layers"));
  }
  CHECK_FALSE(PpLayerRanges(4, 0, {}).ok());
}

TEST_CASE("pipeline stages: which stage holds a tensor") {
  CHECK(LayerOf("model.layers.12.mlp.up_proj.weight") == 12);
  CHECK(LayerOf("transformer.h.3.attn.c_attn.weight") == 3);
  CHECK(LayerOf("model.layers.1.mlp.experts.7.w1.weight") == 1);
  CHECK_FALSE(LayerOf("model.embed_tokens.weight"));
  CHECK_FALSE(LayerOf("model.layers.x1.weight"));
  CHECK_FALSE(LayerOf("lm_head.weight"));

  const Ranges ranges = Split(5, 3);  // {0, 2}, {2, 4}, {4, 5}
  PpModel untied{5, false};
  CHECK(OnStage("model.layers.1.input_layernorm.weight", untied, ranges, 0));
  CHECK_FALSE(OnStage("model.layers.2.input_layernorm.weight", untied, ranges, 0));
  CHECK(OnStage("model.layers.2.input_layernorm.weight", untied, ranges, 1));
  CHECK(OnStage("model.layers.4.input_layernorm.weight", untied, ranges, 2));
  CHECK(OnStage("model.embed_tokens.weight", untied, ranges, 0));
  CHECK_FALSE(OnStage("model.embed_tokens.weight", untied, ranges, 2));
  for (const char* tail : {"model.norm.weight", "lm_head.weight"}) {
    CHECK(OnStage(tail, untied, ranges, 2));
    CHECK_FALSE(OnStage(tail, untied, ranges, 0));
    CHECK_FALSE(OnStage(tail, untied, ranges, 1));
  }
  // Tied: the last stage's head is the embedding, so it holds the embedding too (as vLLM's).
  PpModel tied{5, true};
  CHECK(OnStage("model.embed_tokens.weight", tied, ranges, 0));
  CHECK_FALSE(OnStage("model.embed_tokens.weight", tied, ranges, 1));
  CHECK(OnStage("model.embed_tokens.weight", tied, ranges, 2));
}

TEST_CASE("pipeline stages: the stack's length and the tie, from config.json and the names") {
  const std::vector<std::string> names = {"model.embed_tokens.weight",
                                          "model.layers.0.mlp.up_proj.weight",
                                          "model.layers.3.mlp.up_proj.weight", "model.norm.weight"};
  auto model = PpModelOf("", names);
  REQUIRE(model.ok());
  CHECK(model->layers == 4);
  CHECK(model->tied);  // no lm_head.weight and no config to say otherwise
  model = PpModelOf(R"({"num_hidden_layers": 6, "tie_word_embeddings": false})", names);
  REQUIRE(model.ok());
  CHECK(model->layers == 6);
  CHECK_FALSE(model->tied);
  model = PpModelOf(R"({"num_hidden_layers": 3})", names);
  REQUIRE_FALSE(model.ok());
  CHECK_THAT(std::string(model.status().message()),
             Catch::Contains("model.layers.3.mlp.up_proj.weight") &&
                 Catch::Contains("num_hidden_layers 3"));
  CHECK_FALSE(PpModelOf(R"({"num_hidden_layers": "six"})", names).ok());
  CHECK_FALSE(PpModelOf("[1]", names).ok());
}

// DeepSeek-V3 stores its multi-token-prediction layer after the stack (model.layers.61 of 61
// layers, num_nextn_predict_layers 1): it follows the head, on the last stage. A vision tower's
// blocks are another stack: not decoder layers, and on the first stage (its output is the first
// layer's input), whatever their numbers.
TEST_CASE("pipeline stages: an MTP layer past the stack, and a vision tower's blocks") {
  const std::vector<std::string> mtp_names = {
      "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
      "model.layers.3.mlp.up_proj.weight", "model.layers.4.eh_proj.weight", "model.norm.weight",
      "lm_head.weight"};
  auto mtp = PpModelOf(R"({"num_hidden_layers": 4, "num_nextn_predict_layers": 1})", mtp_names);
  REQUIRE(mtp.ok());
  CHECK(mtp->layers == 4);
  CHECK(mtp->mtp == 1);
  CHECK(mtp->stack == "model.layers.");
  auto ranges = PpLayerRanges(mtp->layers, 2, {});
  REQUIRE(ranges.ok());
  CHECK(OnStage("model.layers.4.eh_proj.weight", *mtp, *ranges, 1));
  CHECK_FALSE(OnStage("model.layers.4.eh_proj.weight", *mtp, *ranges, 0));
  CHECK(OnStage("model.layers.3.mlp.up_proj.weight", *mtp, *ranges, 1));
  // Without num_nextn_predict_layers, layer 4 of 4 is still an error.
  CHECK_FALSE(PpModelOf(R"({"num_hidden_layers": 4})", mtp_names).ok());

  std::vector<std::string> vl = {"model.embed_tokens.weight", "model.norm.weight",
                                 "lm_head.weight"};
  for (int i = 0; i < 3; ++i) vl.push_back(fmt::format("model.layers.{}.mlp.w.weight", i));
  for (int i = 0; i < 5; ++i) {  // more blocks, and more tensors, than the decoder
    vl.push_back(fmt::format("model.visual.blocks.{}.attn.qkv.weight", i));
    vl.push_back(fmt::format("model.visual.blocks.{}.attn.proj.weight", i));
  }
  vl.push_back("model.visual.patch_embed.proj.weight");  // the tower's, without a number
  vl.push_back("model.mtp_layers.0.proj.weight");        // MTP layers in a stack of their own
  auto model = PpModelOf(R"({"text_config": {"num_hidden_layers": 3}})", vl);
  REQUIRE(model.ok());
  CHECK(model->layers == 3);
  CHECK(model->stack == "model.layers.");
  ranges = PpLayerRanges(model->layers, 3, {});
  REQUIRE(ranges.ok());
  CHECK(OnStage("model.visual.blocks.4.attn.qkv.weight", *model, *ranges, 0));
  CHECK_FALSE(OnStage("model.visual.blocks.4.attn.qkv.weight", *model, *ranges, 2));
  CHECK(OnStage("model.layers.2.mlp.w.weight", *model, *ranges, 2));
  CHECK(OnStage("model.visual.patch_embed.proj.weight", *model, *ranges, 0));
  CHECK_FALSE(OnStage("model.visual.patch_embed.proj.weight", *model, *ranges, 2));
  CHECK(OnStage("model.mtp_layers.0.proj.weight", *model, *ranges, 2));
  CHECK_FALSE(OnStage("model.mtp_layers.0.proj.weight", *model, *ranges, 0));
  CHECK(OnStage("model.norm.weight", *model, *ranges, 2));
  CHECK(StackOf("model.visual.blocks.4.attn.qkv.weight") == "model.visual.blocks.");
  CHECK(StackOf("model.norm.weight").empty());
}

}  // namespace
}  // namespace loadstone::planning
