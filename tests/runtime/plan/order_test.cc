// The plan's order (PlanOptions::order, runtime/plan/exec_order.h): execution order against the
// order each model's own forward pass calls its modules in (tests/fixtures/order, made by
// make_order_fixtures.py with diffusers, transformers and gguf), a model description's
// registration order, file order and a given order.
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/device_map.h"
#include "loadstone/plan.h"
#include "runtime/plan/exec_order.h"

namespace loadstone {
namespace {

std::string Fixture(const std::string& path) {
  return std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/" + path;
}

nlohmann::json Expected() {
  std::ifstream in(Fixture("order/expected.json"));
  return nlohmann::json::parse(in);
}

Checkpoint Open(const std::string& folder) {
  auto checkpoint = Checkpoint::Open(Fixture(folder));
  REQUIRE(checkpoint.ok());
  return std::move(*checkpoint);
}

std::vector<std::string> Prefixes(const LoadPlan& plan) {
  std::vector<std::string> out;
  for (const PlanModule& m : plan.modules) out.push_back(m.prefix);
  return out;
}

// Every module of the plan is called by the model's forward pass no earlier than the module
// before it (a module is called when the first of its parameters' modules is); the modules never
// called (DeepSeek's MTP layer) come last. The modules cut the plan's tensors in order.
void CheckFollowsCalls(const Checkpoint& checkpoint, const LoadPlan& plan,
                       const nlohmann::json& calls) {
  std::map<std::string, size_t> called;
  for (size_t i = 0; i < calls.size(); ++i) called.emplace(calls[i].get<std::string>(), i);
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  size_t last = 0;
  uint32_t next = 0;
  for (const PlanModule& m : plan.modules) {
    REQUIRE(m.first == next);
    REQUIRE(m.end > m.first);
    next = m.end;
    size_t first_call = kNever;
    for (uint32_t t = m.first; t < m.end; ++t) {
      const std::string& name = checkpoint.tensors()[plan.tensors[t].source].name;
      CHECK((name == m.prefix || name.starts_with(m.prefix + ".")));
      if (auto it = called.find(name); it != called.end()) {
        first_call = std::min(first_call, it->second);
      }
    }
    INFO("module " << m.prefix << " first called at " << first_call << ", the one before at "
                   << last);
    CHECK(first_call >= last);
    last = first_call;
  }
  CHECK(next == plan.tensors.size());
}

TEST_CASE("execution order follows each model's own forward pass", "[order]") {
  const nlohmann::json expected = Expected();
  for (const auto& [model, doc] : expected.items()) {
    SECTION(model) {
      const Checkpoint checkpoint = Open(doc["folder"].get<std::string>());
      auto plan = Plan(checkpoint);
      REQUIRE(plan.ok());
      CHECK(plan->order == TensorOrder::kExecution);
      CheckFollowsCalls(checkpoint, *plan, doc["calls"]);
    }
  }
}

TEST_CASE("execution order by rule: layers by number, norm then head, MTP last", "[order]") {
  const Checkpoint llama = Open("tp/models/llama");
  auto plan = Plan(llama);
  REQUIRE(plan.ok());
  const auto prefixes = Prefixes(*plan);
  REQUIRE(prefixes.size() >= 4);
  CHECK(prefixes.front() == "model.embed_tokens");
  CHECK(prefixes[1] == "model.layers.0");
  CHECK(prefixes[prefixes.size() - 2] == "model.norm");
  CHECK(prefixes.back() == "lm_head");
  // DeepSeek's layer 3 of num_hidden_layers 3 is its multi-token-prediction layer: after the
  // head, though its number follows layer 2's.
  const Checkpoint deepseek = Open("order/deepseek");
  CHECK(deepseek.config().num_hidden_layers == 3);
  CHECK(deepseek.config().num_nextn_predict_layers == 1);
  plan = Plan(deepseek);
  REQUIRE(plan.ok());
  const auto ds = Prefixes(*plan);
  CHECK(ds.back() == "model.layers.3");
  CHECK(ds[ds.size() - 2] == "lm_head");
  CHECK(ds[ds.size() - 3] == "model.norm");
}

TEST_CASE("execution order from a model description: registration order, mid before up",
          "[order]") {
  const Checkpoint unet = Open("order/unet");
  std::ifstream in(Fixture("order/unet.model.json"));
  std::stringstream text;
  text << in.rdbuf();
  auto description = ParseModelDescription(text.str());
  INFO(description.status().ToString());
  REQUIRE(description.ok());
  PlanOptions options;
  options.model = description->tree;
  auto plan = Plan(unet, options);
  REQUIRE(plan.ok());
  CheckFollowsCalls(unet, *plan, Expected()["unet"]["calls"]);
  const auto prefixes = Prefixes(*plan);
  // diffusers registers up_blocks before mid_block; it runs mid_block first.
  const auto at = [&](const std::string& p) {
    return std::find(prefixes.begin(), prefixes.end(), p) - prefixes.begin();
  };
  CHECK(at("mid_block") < at("up_blocks.0"));
  CHECK(at("down_blocks.1") < at("mid_block"));
  CHECK(prefixes.back() == "conv_out");
}

TEST_CASE("file order reads each file front to back", "[order]") {
  const Checkpoint llama = Open("order/deepseek");
  PlanOptions options;
  options.order = TensorOrder::kFile;
  auto plan = Plan(llama, options);
  REQUIRE(plan.ok());
  CHECK(plan->order == TensorOrder::kFile);
  for (size_t t = 1; t < plan->tensors.size(); ++t) {
    const TensorInfo& a = llama.tensors()[plan->tensors[t - 1].source];
    const TensorInfo& b = llama.tensors()[plan->tensors[t].source];
    CHECK(std::tie(a.file, a.offset) < std::tie(b.file, b.offset));
  }
  // The reads follow: each file's offsets never go back.
  for (size_t r = 1; r < plan->reads.size(); ++r) {
    const ReadChunk& a = plan->reads[r - 1];
    const ReadChunk& b = plan->reads[r];
    CHECK(std::tie(a.file, a.offset) < std::tie(b.file, b.offset));
  }
  // safetensors stores names sorted: the head before the model, MTP layer 3 before the norm.
  const auto prefixes = Prefixes(*plan);
  CHECK(prefixes.front() == "lm_head");
  CHECK(prefixes.back() == "model.norm");
  CHECK(prefixes[prefixes.size() - 2] == "model.layers.3");
}

TEST_CASE("a given order: its prefixes first, the longest match, the rest in execution order",
          "[order]") {
  const Checkpoint llama = Open("tp/models/llama");
  PlanOptions options;
  options.order = TensorOrder::kGiven;
  options.order_prefixes = {"lm_head", "model.layers.1"};
  auto plan = Plan(llama, options);
  REQUIRE(plan.ok());
  CHECK(Prefixes(*plan) == std::vector<std::string>{"lm_head", "model.layers.1",
                                                    "model.embed_tokens", "model.layers.0",
                                                    "model.norm"});
  options.order_prefixes = {"model", "model.layers.1.mlp"};
  plan = Plan(llama, options);
  REQUIRE(plan.ok());
  CHECK(Prefixes(*plan) == std::vector<std::string>{"model", "model.layers.1.mlp", "lm_head"});
  // Under "model", execution order still holds: the embeddings first, the norm last.
  const PlanModule& model = plan->modules.front();
  CHECK(llama.tensors()[plan->tensors[model.first].source].name == "model.embed_tokens.weight");
  CHECK(llama.tensors()[plan->tensors[model.end - 1].source].name == "model.norm.weight");

  options.order_prefixes = {"model.layers.7"};
  auto bad = Plan(llama, options);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("'model.layers.7'"));
  options.order_prefixes = {};
  CHECK(Plan(llama, options).status().code() == StatusCode::kInvalidArgument);
  options.order_prefixes = {"lm_head", ""};
  CHECK_THAT(std::string(Plan(llama, options).status().message()), Catch::Contains("prefix 2"));
}

// What a plan orders, by name: its tensors, its reads (file, offset, length, the tensors in each),
// its modules.
std::vector<std::string> Ordered(const Checkpoint& checkpoint, const LoadPlan& plan) {
  std::vector<std::string> out;
  const auto name = [&](uint32_t t) { return checkpoint.tensors()[plan.tensors[t].source].name; };
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) out.push_back(name(t));
  for (const ReadChunk& r : plan.reads) {
    std::string read = fmt::format("read {} {} {}:", r.file, r.offset, r.length);
    for (uint32_t t : r.tensors) read += " " + name(t);
    out.push_back(read);
  }
  for (const PlanModule& m : plan.modules) out.push_back(fmt::format("{} {} {}", m.prefix, m.first, m.end));
  return out;
}

// A catalog in file order (every safetensors checkpoint's) is ordered without comparisons; one
// out of it (here the same tensors listed backwards) by sorting keys. Both must plan alike.
TEST_CASE("a catalog out of file order plans as the same catalog in it", "[order]") {
  for (const char* folder : {"order/deepseek", "order/unet", "order/flux", "order/gguf/llama.gguf",
                             "tp/models/llama"}) {
    INFO(folder);
    const Checkpoint checkpoint = Open(folder);
    REQUIRE(planning::FileOrdered(checkpoint.tensors()));
    std::vector<TensorInfo> backwards(checkpoint.tensors().rbegin(), checkpoint.tensors().rend());
    auto reversed = checkpoint.WithTensors(backwards);
    REQUIRE(reversed.ok());
    REQUIRE_FALSE(planning::FileOrdered(reversed->tensors()));
    for (TensorOrder order : {TensorOrder::kExecution, TensorOrder::kFile, TensorOrder::kGiven}) {
      PlanOptions options;
      options.order = order;
      options.order_prefixes = {checkpoint.tensors().back().name};
      auto a = Plan(checkpoint, options);
      auto b = Plan(*reversed, options);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      CHECK(Ordered(checkpoint, *a) == Ordered(*reversed, *b));
    }
  }
}

TEST_CASE("the module of a tensor in the order", "[order]") {
  using planning::OrderModuleOf;
  CHECK(OrderModuleOf("model.layers.12.mlp.up_proj.weight") == "model.layers.12");
  CHECK(OrderModuleOf("model.norm.weight") == "model.norm");
  CHECK(OrderModuleOf("lm_head.weight") == "lm_head");
  CHECK(OrderModuleOf("logit_scale") == "logit_scale");
  CHECK(OrderModuleOf("mid_block.resnets.0.conv1.weight") == "mid_block");
  CHECK(OrderModuleOf("blk.3.attn_q.weight") == "blk.3");
  // A module the rules place is one module of the order, whatever it holds.
  CHECK(OrderModuleOf("time_embedding.linear_1.bias") == "time_embedding");
  CHECK(OrderModuleOf("time_text_embed.text_embedder.linear_1.weight") == "time_text_embed");
  CHECK(OrderModuleOf("encoder.mid_block.resnets.0.conv1.weight") == "encoder.mid_block");
  CHECK(OrderModuleOf("encoder.conv_in.weight") == "encoder.conv_in");
  CHECK(OrderModuleOf("a.b.c.weight") == "a.b.c");
  CHECK(planning::NaturalLess("layers.2", "layers.10"));
  CHECK_FALSE(planning::NaturalLess("layers.10", "layers.2"));
}

}  // namespace
}  // namespace loadstone
