// Compute while loading, through the LibTorch face: a Llama (examples/forward_while_loading/
// llama.h) runs its forward pass layer by layer as each layer's module lands
// (libtorch::StartLoadInto, ModuleLoad::Module), on a load slowed down so that it is still
// running; its logits equal, bit for bit, those of the same model after a whole LoadInto, and
// those transformers computed for the checkpoint (tests/fixtures/make_order_fixtures.py).
#include <chrono>
#include <fstream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "examples/forward_while_loading/llama.h"
#include "loadstone/torch.h"
#include "tests/runtime/pipeline/test_platform.h"

#undef CHECK  // glog's; Catch's below
#include <catch2/catch.hpp>

namespace loadstone {
namespace {

const std::string kLlama = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/models/llama";

nlohmann::json Reference() {
  std::ifstream in(std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/order/expected.json");
  return nlohmann::json::parse(in)["llama"];
}

torch::Tensor Ids(const nlohmann::json& reference) {
  std::vector<int64_t> ids = reference["input_ids"][0].get<std::vector<int64_t>>();
  return torch::tensor(ids, torch::kLong).unsqueeze(0);
}

TEST_CASE("forward while loading: each layer runs as its module lands, logits bit-identical",
          "[torch][order]") {
  const llama::Config config = llama::Config::Read(kLlama + "/config.json");
  const nlohmann::json reference = Reference();
  const torch::Tensor ids = Ids(reference);
  torch::NoGradGuard no_grad;

  llama::ForCausalLM whole(config);
  REQUIRE(libtorch::LoadInto(*whole, kLlama).ok());
  const torch::Tensor expected = whole->Forward(ids);
  // The model is transformers' own: its logits, within float32 rounding of another kernel order.
  const auto rows = reference["logits"][0].get<std::vector<std::vector<float>>>();
  for (size_t s = 0; s < rows.size(); ++s) {
    INFO("position " << s);
    CHECK(torch::allclose(expected[0][static_cast<int64_t>(s)], torch::tensor(rows[s]), 1e-5,
                          1e-4));
  }

  // Streamed: reads held back 5 ms each, one at a time, so that the load runs on while the
  // first layers compute.
  auto slow = testing::SlowReads(std::chrono::milliseconds(5));
  libtorch::TorchLoadOptions options;
  options.loader = std::make_shared<Loader>(testing::OneReadAtATime(slow));
  llama::ForCausalLM streamed(config);
  auto load = libtorch::StartLoadInto(*streamed, kLlama, options);
  REQUIRE(load.ok());
  libtorch::ModuleLoad& l = **load;
  CHECK(l.plan().modules.front().prefix == "model.embed_tokens");
  CHECK(l.plan().modules.back().prefix == "lm_head");
  REQUIRE(l.Module("model.embed_tokens").get().ok());
  const Progress at_embed = l.handle().progress();
  const bool ran_while_loading = at_embed.tensors_done < at_embed.tensors_total;
  torch::Tensor x = streamed->Embed(ids);
  for (int64_t k = 0; k < config.layers; ++k) {
    REQUIRE(l.Module(fmt::format("model.layers.{}", k)).get().ok());
    x = streamed->Layer(k, x);
  }
  REQUIRE(l.Module("model.norm").get().ok());
  REQUIRE(l.Module("lm_head").get().ok());
  const torch::Tensor logits = streamed->Head(x);
  auto report = l.Finish();
  REQUIRE(report.ok());
  CHECK(report->missing_keys.empty());
  CHECK(report->unexpected_keys.empty());
  CHECK(torch::equal(logits, expected));
  CHECK(ran_while_loading);
  CHECK(l.Finish().status().code() == StatusCode::kInvalidArgument);  // once
}

TEST_CASE("forward while loading: a module that names nothing, and a load dropped unfinished",
          "[torch][order]") {
  const llama::Config config = llama::Config::Read(kLlama + "/config.json");
  llama::ForCausalLM model(config);
  auto slow = testing::SlowReads(std::chrono::milliseconds(20));
  libtorch::TorchLoadOptions options;
  options.loader = std::make_shared<Loader>(testing::OneReadAtATime(slow));
  auto load = libtorch::StartLoadInto(*model, kLlama, options);
  REQUIRE(load.ok());
  const Status none = (*load)->Module("model.layers.2").get();
  CHECK(none.code() == StatusCode::kNotFound);
  auto head = (*load)->Module("lm_head");
  load->reset();  // cancels and waits: the module's future holds the cancellation
  CHECK(head.get().code() == StatusCode::kCancelled);
  // The Loader goes on.
  llama::ForCausalLM again(config);
  CHECK(libtorch::LoadInto(*again, kLlama, options).ok());
}

}  // namespace
}  // namespace loadstone
