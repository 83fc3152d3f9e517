// Checkpoint::Companions / Dequantizes: the catalog's one rule for which tensors belong to a
// quantized weight, on fixtures written by the producers (bitsandbytes, compressed-tensors,
// gguf-py).
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"

namespace loadstone {
namespace {

std::string Fixture(const std::string& path) {
  return std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/" + path;
}

Checkpoint Open(const std::string& path) {
  auto c = Checkpoint::Open(Fixture(path));
  REQUIRE(c.ok());
  return *std::move(c);
}

std::vector<std::string> Names(const Checkpoint& c, const std::string& weight) {
  const TensorInfo* t = c.Find(weight);
  REQUIRE(t != nullptr);
  auto companions = c.Companions(*t);
  REQUIRE(companions.ok());
  std::vector<std::string> out;
  for (const TensorInfo* companion : *companions) out.push_back(companion->name);
  return out;
}

}  // namespace

TEST_CASE("companions: a bitsandbytes 4-bit weight's quant state, absmax first") {
  const Checkpoint c = Open("bnb/bnb4.safetensors");
  CHECK(Names(c, "nf4.weight") ==
        std::vector<std::string>{"nf4.weight.absmax", "nf4.weight.quant_map",
                                 "nf4.weight.quant_state.bitsandbytes__nf4"});
  const std::vector<std::string> nested = Names(c, "nested.weight");
  CHECK(nested.front() == "nested.weight.absmax");
  CHECK(std::find(nested.begin(), nested.end(), "nested.weight.nested_absmax") != nested.end());
  CHECK(c.Dequantizes(*c.Find("nf4.weight")));
  // A quant-state tensor is no weight of its own.
  CHECK(Names(c, "nf4.weight.absmax").empty());
  CHECK_FALSE(c.Dequantizes(*c.Find("nf4.weight.absmax")));
}

TEST_CASE("companions: a float8 weight's scales (compressed-tensors weight_scale)") {
  const Checkpoint c = Open("ct/float.safetensors");
  for (const char* w : {"f8_block", "f8_channel", "f8_group", "f8_tensor"}) {
    CAPTURE(w);
    CHECK(Names(c, std::string(w) + ".weight") ==
          std::vector<std::string>{std::string(w) + ".weight_scale"});
    CHECK(c.Dequantizes(*c.Find(std::string(w) + ".weight")));
  }
}

TEST_CASE("companions: GGUF blocks carry their scales inside, plain tensors have none") {
  const Checkpoint c = Open("gguf/quantized.gguf");
  size_t packed = 0;
  for (const TensorInfo& t : c.tensors()) {
    CAPTURE(t.name);
    auto companions = c.Companions(t);
    REQUIRE(companions.ok());
    CHECK(companions->empty());
    CHECK(c.Dequantizes(t) == t.packed.has_value());
    packed += t.packed.has_value();
  }
  CHECK(packed > 0);
}

TEST_CASE("companions: a view that left a quant-state tensor out is refused, naming it") {
  const Checkpoint c = Open("bnb/bnb4.safetensors");
  std::vector<TensorInfo> kept;
  for (const TensorInfo& t : c.tensors()) {
    if (t.name != "nf4.weight.quant_map") kept.push_back(t);
  }
  auto view = c.WithTensors(std::move(kept));
  REQUIRE(view.ok());
  auto companions = view->Companions(*view->Find("nf4.weight"));
  REQUIRE_FALSE(companions.ok());
  CHECK(companions.status().code() == StatusCode::kInvalidArgument);
  CHECK(std::string(companions.status().message()) ==
        "tensor 'nf4.weight' is bnb-nf4-packed, but its quant-state tensor 'nf4.weight.quant_map' is "
        "not in the checkpoint; list it beside the weight");
}

}  // namespace loadstone
