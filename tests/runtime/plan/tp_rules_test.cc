// Tensor-parallel sharding rules against transformers itself: tests/fixtures/tp/cases.json
// (make_tp_fixtures.py) holds, for small Llama / Qwen2 / Qwen3 models and a plan given by hand,
// the model's merged plan, each parameter's style and the elements transformers' loader gives
// every rank of 2, 3 and 4.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/plan/ep_rules.h"
#include "runtime/plan/tp_rules.h"

namespace loadstone::planning {
namespace {

const nlohmann::ordered_json& Cases() {
  static const nlohmann::ordered_json cases = [] {
    std::ifstream in(std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/cases.json");
    std::stringstream text;
    text << in.rdbuf();
    return nlohmann::ordered_json::parse(text.str());
  }();
  return cases;
}

// The model's config.json as it is on disk: its model type and, for the case that carries one,
// its own base_model_tp_plan (config.json files written by transformers leave it out).
bool CarriesPlan(const nlohmann::ordered_json& model) {
  return model["name"] == "llama-config-plan";
}

// The model's plan as loadstone builds it from its config.json and its tensors' names.
TpPlan PlanOf(const nlohmann::ordered_json& model) {
  if (model["name"] == "by-hand") {  // the plan given whole, as a user gives one
    nlohmann::ordered_json given = nlohmann::ordered_json::object();
    for (const auto& entry : model["tp_plan"]) given[entry[0].get<std::string>()] = entry[1];
    auto plan = TpPlan::FromJson(given.dump());
    REQUIRE(plan.ok());
    return *plan;
  }
  nlohmann::ordered_json config = {{"model_type", model["model_type"]}};
  if (CarriesPlan(model)) config["base_model_tp_plan"] = model["base_model_tp_plan"];
  std::vector<std::string> names;
  for (const auto& param : model["parameters"]) names.push_back(param["name"]);
  auto plan = TpPlanFromConfig(config.dump(), names);
  REQUIRE(plan.ok());
  return *plan;
}

TEST_CASE("layer numbers become wildcards as transformers makes them") {
  for (const auto& pair : Cases()["wildcards"]) {
    CHECK(WildcardName(pair[0].get<std::string>()) == pair[1].get<std::string>());
  }
}

TEST_CASE("the built-in base plans and the merged plans are transformers' own") {
  for (const auto& model : Cases()["models"]) {
    INFO(model["name"]);
    if (model["name"] != "by-hand" && !CarriesPlan(model)) {
      auto base = DefaultBaseTpPlan(model["model_type"].get<std::string>());
      REQUIRE(base.has_value());
      REQUIRE(base->entries().size() == model["base_model_tp_plan"].size());
      for (const auto& [key, style] : base->entries()) {
        INFO(key);
        auto theirs = ParseTpStyle(model["base_model_tp_plan"][key].get<std::string>());
        REQUIRE(theirs.ok());
        CHECK(*theirs == style);
      }
    }
    const TpPlan plan = PlanOf(model);
    REQUIRE(plan.entries().size() == model["tp_plan"].size());
    for (size_t i = 0; i < plan.entries().size(); ++i) {
      CHECK(plan.entries()[i].first == model["tp_plan"][i][0].get<std::string>());
      CHECK(plan.entries()[i].second == *ParseTpStyle(model["tp_plan"][i][1].get<std::string>()));
    }
  }
}

TEST_CASE("every rank holds the elements transformers gives it, parameter by parameter") {
  size_t checked = 0;
  for (const auto& model : Cases()["models"]) {
    const TpPlan plan = PlanOf(model);
    for (const auto& param : model["parameters"]) {
      const std::string name = param["name"];
      INFO(model["name"] << " " << name);
      const auto style = plan.Lookup(name);
      REQUIRE(style.has_value() == !param["style"].is_null());
      if (!style) continue;
      CHECK(*style == *ParseTpStyle(param["style"].get<std::string>()));
      const std::vector<int64_t> shape = param["shape"];
      for (const auto& [world_text, ranks] : param["ranks"].items()) {
        const int world = std::stoi(world_text);
        for (int rank = 0; rank < world; ++rank) {
          INFO("rank " << rank << " of " << world);
          auto runs = TpElementRuns(*style, name, shape, rank, world);
          REQUIRE(runs.ok());
          std::vector<ElementRun> theirs;
          for (const auto& run : ranks[rank]) theirs.push_back({run[0], run[1]});
          CHECK(*runs == theirs);
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("what transformers cannot split is refused, naming the tensor and the way out") {
  const std::vector<int64_t> odd = {10, 8};
  auto packed = TpElementRuns(TpStyle::kPackedColwise, "m.gate_up_proj.weight", odd, 1, 4);
  REQUIRE(!packed.ok());
  CHECK(packed.status().message().find("m.gate_up_proj.weight") != std::string::npos);
  CHECK(packed.status().message().find("replicate") != std::string::npos);
  const std::vector<int64_t> flat = {8};
  CHECK(!TpElementRuns(TpStyle::kEmbeddingColwise, "e.weight", flat, 0, 2).ok());
  CHECK(!TpElementRuns(TpStyle::kColwise, "q.weight", flat, 2, 2).ok());
  CHECK(ParseTpStyle("unit_colwise").status().code() == StatusCode::kUnsupported);
  CHECK(ParseTpStyle("colwize").status().message().find("colwise_gather_output") !=
        std::string::npos);
  CHECK(!TpPlan::FromJson(R"(["colwise"])").ok());
  const std::vector<std::string> names = {"model.layers.0.mlp.w1.weight"};
  auto unknown = TpPlanFromConfig(R"({"model_type": "phi9"})", names);
  CHECK(unknown.status().code() == StatusCode::kNotFound);
  CHECK(unknown.status().message().find("--tp-plan") != std::string::npos);
  CHECK(!TpPlanFromConfig(R"({"model_type": "llama", "base_model_tp_plan": {"x": "sideways"}})",
                          names).ok());
  // Tail ranks of a dimension shorter than the world hold nothing (torch.chunk).
  const std::vector<int64_t> two = {2, 3};
  auto empty = TpElementRuns(TpStyle::kColwise, "k.weight", two, 3, 4);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

// Expert parallelism: the ep plans and what they make of names; what each rank then holds is
// checked against transformers in tests/runtime/dist/ep_test.cc.
TEST_CASE("expert parallel: grouped_gemm, the ep plans, and the names of one expert's tensors") {
  REQUIRE(ParseTpStyle("grouped_gemm").ok());
  CHECK(*ParseTpStyle("grouped_gemm") == TpStyle::kGroupedGemm);
  const std::vector<int64_t> stacked = {8, 4, 6};  // [experts, in, out]
  auto part = TpPartOf(TpStyle::kGroupedGemm, "m.experts.gate_up_proj", stacked, 1, 4);
  REQUIRE(part.ok());
  CHECK(part->dim == 0);
  CHECK(part->shape == std::vector<uint64_t>{2, 4, 6});
  CHECK(part->runs == std::vector<ElementRun>{{48, 48}});
  auto uneven = TpPartOf(TpStyle::kGroupedGemm, "m.experts.down_proj", stacked, 0, 3);
  REQUIRE(!uneven.ok());
  CHECK(uneven.status().message().find("8 experts") != std::string::npos);

  const std::vector<std::string> names = {"model.layers.0.mlp.experts.0.gate_proj.weight"};
  auto ep = EpPlanFromConfig(R"({"model_type": "qwen3_moe"})", names);
  REQUIRE(ep.ok());
  CHECK(ep->Lookup("model.layers.5.mlp.experts.gate_up_proj") == TpStyle::kGroupedGemm);
  CHECK(SplitsExperts(*ep, "model.layers.5.mlp.experts"));
  CHECK(SplitsExperts(*ep, "model.layers.5.block_sparse_moe.experts"));  // Mixtral's name
  CHECK(!SplitsExperts(*ep, "model.layers.5.mlp.shared_experts"));
  CHECK(!SplitsExperts(*ep, "model.layers.5.self_attn"));
  CHECK(EpPlanFromConfig(R"({"model_type": "llama"})", names).status().code() ==
        StatusCode::kNotFound);
  auto given = EpPlanFromConfig(R"({"model_type": "llama",
      "base_model_ep_plan": {"layers.*.moe.experts.w": "grouped_gemm"}})",
                                names);
  REQUIRE(given.ok());
  CHECK(SplitsExperts(*given, "model.layers.1.moe.experts"));

  // EP rules take precedence: a tp rule on an ep module, or under one, is dropped.
  auto tp = TpPlan::FromJson(R"({"model.layers.*.mlp.experts": "colwise",
      "model.layers.*.mlp.experts.down_proj": "rowwise", "model.layers.*.mlp.experts_x": "colwise",
      "model.layers.*.self_attn.q_proj": "colwise"})");
  REQUIRE(tp.ok());
  auto merged = WithExpertPlan(*tp, *ep);
  REQUIRE(merged.ok());
  CHECK(merged->Lookup("model.layers.0.mlp.experts.down_proj") == TpStyle::kGroupedGemm);
  CHECK(merged->Lookup("model.layers.0.mlp.experts.gate_up_proj") == TpStyle::kGroupedGemm);
  CHECK(merged->Lookup("model.layers.0.mlp.experts_x.weight") == TpStyle::kColwise);
  CHECK(merged->Lookup("model.layers.0.self_attn.q_proj.weight") == TpStyle::kColwise);

  auto one = ExpertTensorOf("model.layers.0.mlp.experts.13.gate_proj.weight");
  REQUIRE(one);
  CHECK(one->experts == "model.layers.0.mlp.experts");
  CHECK(one->index == 13);
  CHECK(one->module == "gate_proj");
  CHECK(SplitsByExpert(*ep, *one));
  auto gate_only = TpPlan::FromJson(
      R"({"model.layers.*.mlp.experts.gate_up_proj": "grouped_gemm"})");
  REQUIRE(gate_only.ok());
  CHECK(SplitsByExpert(*gate_only, *one));
  CHECK(!SplitsByExpert(*gate_only,
                        *ExpertTensorOf("model.layers.0.mlp.experts.13.down_proj.weight")));
  CHECK(SplitsByExpert(*gate_only,
                       *ExpertTensorOf("model.layers.0.block_sparse_moe.experts.1.w3.weight")));
  CHECK(!SplitsByExpert(*gate_only,
                        *ExpertTensorOf("model.layers.0.block_sparse_moe.experts.1.w2.weight")));
  // A module transformers' mapping does not name goes with its expert when any parameter splits.
  CHECK(SplitsByExpert(*gate_only, *ExpertTensorOf("model.layers.0.mlp.experts.1.fc9.weight")));
  CHECK(ExpertTensorOf("experts.2.w1.weight")->experts == "experts");
  CHECK(!ExpertTensorOf("model.layers.0.mlp.experts.gate_up_proj"));
  CHECK(!ExpertTensorOf("model.layers.0.mlp.shared_experts.gate_proj.weight"));
  CHECK(!ExpertTensorOf("model.layers.0.mlp.experts.3"));
  CHECK(!ExpertTensorOf("model.layers.0.mlp.experts.99999999999999999999.w"));
  CHECK(!ExpertTensorOf("model.layers.0.mlp.experts.01.w"));
  CHECK(ExpertTensorOf("model.layers.0.mlp.experts.0.w")->index == 0);
}

}  // namespace
}  // namespace loadstone::planning
