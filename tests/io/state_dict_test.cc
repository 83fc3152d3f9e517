// MatchStateDict: which checkpoint tensor fills which key of a model's state dict, on the
// committed compressed-tensors fixture (decoded names, quant state belonging to its weight).
#include <algorithm>

#include <catch2/catch.hpp>

#include "loadstone/state_dict.h"

namespace loadstone {
namespace {

const std::string kPack = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/ct/pack.safetensors";

Checkpoint OpenPack() {
  auto c = Checkpoint::Open(kPack);
  REQUIRE(c.ok());
  return *c;
}

std::vector<std::string> FillKeys(const KeyMatch& m) {
  std::vector<std::string> out;
  for (const KeyFill& f : m.fills) out.push_back(f.key);
  return out;
}

}  // namespace

TEST_CASE("state dict: a floating key takes the decoded weight, and its quant state with it",
          "[state_dict]") {
  const Checkpoint c = OpenPack();
  const KeyMatch m = MatchStateDict(c, {{"asym4_group.weight", {196, 128}, true},
                                        {"asym4_group.bias", {196}, true}});
  REQUIRE(FillKeys(m) == std::vector<std::string>{"asym4_group.weight"});
  CHECK(c.tensors()[m.fills[0].tensor].name == "asym4_group.weight_packed");
  CHECK(m.fills[0].dequantized);
  CHECK(m.fills[0].shape == std::vector<uint64_t>{196, 128});
  CHECK(m.missing == std::vector<std::string>{"asym4_group.bias"});
  for (const std::string& name : m.unexpected) {  // the other weights, not this one's state
    CHECK(name.rfind("asym4_group.", 0) != 0);
  }
  CHECK(m.mismatched.empty());
}

TEST_CASE("state dict: a key of the stored name takes the tensor as stored", "[state_dict]") {
  const Checkpoint c = OpenPack();
  const KeyMatch m = MatchStateDict(c, {{"asym4_group.weight_packed", {196, 16}, false},
                                        {"asym4_group.weight_scale", {196, 5}, false}});
  REQUIRE(m.fills.size() == 1);
  CHECK_FALSE(m.fills[0].dequantized);
  CHECK(m.fills[0].key == "asym4_group.weight_packed");
  // Not dequantized: its quant state is the checkpoint's own tensors, here unexpected ones.
  CHECK(std::find(m.unexpected.begin(), m.unexpected.end(), "asym4_group.weight_zero_point") !=
        m.unexpected.end());
  REQUIRE(m.mismatched.size() == 1);  // the scales are [196, 4]: neither filled nor missing
  CHECK(m.mismatched[0].key == "asym4_group.weight_scale");
  CHECK(m.mismatched[0].expected == std::vector<uint64_t>{196, 5});
  CHECK(m.mismatched[0].found == std::vector<uint64_t>{196, 4});
  CHECK(m.missing.empty());
}

}  // namespace loadstone
