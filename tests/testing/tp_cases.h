// tests/fixtures/tp/cases.json (make_tp_fixtures.py): the parts transformers' own loader gives
// each rank of small models, and what a rank's tensor must hold of the models saved beside it
// (tests/fixtures/tp/models/, every parameter holding its own element indices).
#ifndef LOADSTONE_TESTS_TESTING_TP_CASES_H_
#define LOADSTONE_TESTS_TESTING_TP_CASES_H_

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loadstone::testing {

inline const std::string kTpModels =
    std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/models/";

// The model of `name` in tests/fixtures/tp/`file`'s "models"; null when there is none.
inline const nlohmann::json& CaseIn(const nlohmann::json& cases, const std::string& name) {
  static const nlohmann::json none;
  for (const auto& m : cases["models"]) {
    if (m["name"] == name) return m;
  }
  return none;
}

inline nlohmann::json ReadCases(const std::string& file) {
  std::ifstream in(std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/" + file);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// The case of model `name` ("llama", "by-hand", ...); null when there is none.
inline const nlohmann::json& TpCase(const std::string& name) {
  static const nlohmann::json cases = ReadCases("cases.json");
  return CaseIn(cases, name);
}

// tests/fixtures/tp/ep_cases.json (make_ep_fixtures.py): what transformers loads on each rank
// of MoE models under expert parallelism ("qwen3-moe", "mixtral", "gpt-oss", ...); null when
// there is none.
inline const nlohmann::json& EpCase(const std::string& name) {
  static const nlohmann::json cases = ReadCases("ep_cases.json");
  return CaseIn(cases, name);
}

// The element indices rank `rank` of `world` holds of `param` (an entry of a case's
// "parameters"), in order: its runs, or every index when no rule splits it (or world is 1).
inline std::vector<uint64_t> TpIndices(const nlohmann::json& param, int world, int rank) {
  std::vector<uint64_t> out;
  if (param["style"].is_null() || world == 1) {
    uint64_t n = 1;
    for (const auto& d : param["shape"]) n *= d.get<uint64_t>();
    for (uint64_t k = 0; k < n; ++k) out.push_back(k);
    return out;
  }
  for (const auto& run : param["ranks"][std::to_string(world)][rank]) {
    const uint64_t first = run[0].get<uint64_t>();
    for (uint64_t k = 0; k < run[1].get<uint64_t>(); ++k) out.push_back(first + k);
  }
  return out;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_TP_CASES_H_
