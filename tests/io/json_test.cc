// The JSON boundary (io/formats/json_util.h) and the documents read through it: hostile numbers,
// nesting and sizes end in one clean error, never an exception, a stack overflow or a stall.
#include "io/formats/json_util.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "io/formats/hf_index.h"
#include "loadstone/checkpoint.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

std::string Nested(int depth, std::string_view inner = "1") {
  return std::string(static_cast<size_t>(depth), '[') + std::string(inner) +
         std::string(static_cast<size_t>(depth), ']');
}

TEST_CASE("json: a number beyond double's range is Corruption, not an exception") {
  for (const char* text : {"{\"a\": 1e500}", "[-1e400]", "{\"a\": {\"b\": [1, 2, 1E+999]}}"}) {
    INFO(text);
    auto doc = io::ParseJsonStrict(text, "doc");
    REQUIRE_FALSE(doc.ok());
    CHECK(doc.status().code() == StatusCode::kCorruption);
    CHECK(doc.status().message().find("number overflow") != std::string_view::npos);
    CHECK_FALSE(io::ParseJsonStrictOrdered(text, "doc").ok());
  }
}

TEST_CASE("json: nesting is bounded before anything recurses over it") {
  CHECK(io::ParseJsonStrict(Nested(io::kMaxJsonDepth), "doc").ok());
  auto deep = io::ParseJsonStrict(Nested(io::kMaxJsonDepth + 1), "doc");
  REQUIRE_FALSE(deep.ok());
  CHECK(deep.status().message() ==
        "doc nests arrays and objects more than 256 deep (kMaxJsonDepth); no checkpoint document "
        "needs that");
  // A million levels: refused as quickly, no stack used for it.
  auto hostile = io::ParseJsonStrict("{\"a\": " + Nested(1'000'000) + "}", "doc");
  REQUIRE_FALSE(hostile.ok());
  CHECK(hostile.status().code() == StatusCode::kCorruption);
  // Brackets inside strings are text, not nesting.
  CHECK(io::ParseJsonStrict("{\"a\": \"" + std::string(100000, '[') + "\"}", "doc").ok());
}

TEST_CASE("json: duplicate keys and syntax errors keep their messages") {
  auto dup = io::ParseJsonStrict(R"({"a": {"b": 1, "b": 2}})", "doc");
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.status().message() == "doc: key 'b' appears twice in one object");
  auto bad = io::ParseJsonStrict(R"({"a": )", "doc");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().starts_with("doc is not valid JSON: [json.exception.parse_error"));
  // Keys of sibling objects are not duplicates, in a large array too.
  std::string many = "[";
  for (int i = 0; i < 200'000; ++i) many += std::string(i ? "," : "") + "{\"k\": 1}";
  auto big = io::ParseJsonStrict(many + "]", "doc");
  REQUIRE(big.ok());
  CHECK(big->size() == 200'000);
}

TEST_CASE("json: InterpretJson turns the library's exceptions into Corruption") {
  auto doc = io::ParseJsonStrict(R"({"a": [1]})", "doc");
  REQUIRE(doc.ok());
  Result<std::string> r = io::InterpretJson("doc", [&]() -> Result<std::string> {
    return (*doc)["a"].get<std::string>();  // an array read as a string: type_error
  });
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kCorruption);
  CHECK(r.status().message().starts_with("doc holds a value of an unexpected kind"));
}

TEST_CASE("json: an index with hostile values is refused with one line naming it") {
  testing::TempDir dir;
  const std::string deep = dir.Write(
      "deep/model.safetensors.index.json", "{\"weight_map\": {\"a\": " + Nested(100'000) + "}}");
  auto d = io::ReadShardIndex(deep);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("nests arrays and objects more than 256 deep") !=
        std::string_view::npos);
  const std::string wide = dir.Write("wide/model.safetensors.index.json",
                                     "{\"weight_map\": {\"a\": " + Nested(200) + "}}");
  auto w = io::ReadShardIndex(wide);
  REQUIRE_FALSE(w.ok());
  CHECK(w.status().message().find("tensor 'a' maps to an array of 1 values, not to a file name") !=
        std::string_view::npos);
  const std::string huge = dir.Write("num/model.safetensors.index.json",
                                     R"({"metadata": {"total_size": 1e500}, "weight_map": {}})");
  auto n = Checkpoint::Open(dir.Path("num"));
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().code() == StatusCode::kCorruption);
  CHECK(n.status().message().find(huge) != std::string_view::npos);
}

// The index as read: its entries in order, its shards.
std::vector<std::pair<std::string, std::string>> Entries(const io::ShardIndex& index) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [tensor, shard] : index.weight_map) out.emplace_back(tensor, index.shards[shard]);
  return out;
}

TEST_CASE("json: an index reads the same in one pass as through the document") {
  testing::TempDir dir;
  // As producers write it, names out of order: read in one pass, the entries in the document's
  // order. The same bytes after a byte-order mark (which the one pass leaves to nlohmann): the
  // entries of the parsed document, by name. Same index either way.
  const std::string text = R"({"metadata": {"total_size": 96, "format": ["pt", {"x": null}]},
    "weight_map": {"z.weight": "model-00002-of-00002.safetensors",
                   "a.weight": "model-00001-of-00002.safetensors",
                   "caf\u00e9.bias": "model-00002-of-00002.safetensors",
                   "m.weight": "model-00001-of-00002.safetensors"}, "extra": 1.5})";
  auto fast = io::ReadShardIndex(dir.Write("fast/model.safetensors.index.json", text));
  auto slow = io::ReadShardIndex(dir.Write("bom/model.safetensors.index.json", "\xEF\xBB\xBF" + text));
  REQUIRE(fast.ok());
  REQUIRE(slow.ok());
  using Entry = std::pair<std::string, std::string>;
  const std::vector<Entry> in_document = {{"z.weight", "model-00002-of-00002.safetensors"},
                                          {"a.weight", "model-00001-of-00002.safetensors"},
                                          {"caf\xC3\xA9.bias", "model-00002-of-00002.safetensors"},
                                          {"m.weight", "model-00001-of-00002.safetensors"}};
  CHECK(Entries(*fast) == in_document);
  std::vector<Entry> by_name = in_document;
  std::sort(by_name.begin(), by_name.end());
  CHECK(Entries(*slow) == by_name);
  for (const auto* index : {&*fast, &*slow}) {
    CHECK(index->shards == std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                    "model-00002-of-00002.safetensors"});
    CHECK(index->ShardOf("z.weight") == 1u);
    CHECK(index->ShardOf("a.weight") == 0u);
    CHECK(index->ShardOf("caf\xC3\xA9.bias") == 1u);
    CHECK_FALSE(index->ShardOf("a").has_value());
  }
}

TEST_CASE("json: what the one pass declines is read and refused as before") {
  testing::TempDir dir;
  int n = 0;
  const auto refused = [&](const std::string& text, const std::string& message) {
    INFO(text);
    auto index = io::ReadShardIndex(
        dir.Write(std::to_string(n++) + "/model.safetensors.index.json", text));
    REQUIRE_FALSE(index.ok());
    CHECK(index.status().code() == StatusCode::kCorruption);
    CHECK_THAT(std::string(index.status().message()), Catch::EndsWith(message));
  };
  refused(R"({"weight_map": {"a": "s.safetensors", "a": "s.safetensors"}})",
          ": key 'a' appears twice in one object");
  refused(R"({"metadata": {"k": 1, "k": 2}, "weight_map": {}})",
          ": key 'k' appears twice in one object");
  refused(R"({"weight_map": {}, "weight_map": {}})", ": key 'weight_map' appears twice in one object");
  refused(R"({"weight_map": ["a"]})", ": \"weight_map\" is not an object");
  refused(R"({"weight_map": {"a": 7}})", "tensor 'a' maps to number 7, not to a file name");
  refused(R"({"weight_map": {"a": {"b": "c"}}})",
          "tensor 'a' maps to an object of 1 keys, not to a file name");
  refused(R"({"metadata": {}})", " has \"metadata\" but no \"weight_map\"");
  refused(R"({"weight_map": {"a": "/etc/passwd"}})",
          "tensor 'a' maps to '/etc/passwd', which is not a file inside the index's folder");
  refused(R"({"weight_map": {"a": "x/../../s.safetensors"}})",
          "which is not a file inside the index's folder");
  refused(R"([{"weight_map": {}}])", " is not a JSON object");
  // A flat map (no "weight_map") is read through the document: accepted.
  auto flat = io::ReadShardIndex(dir.Write("flat/model.safetensors.index.json",
                                           R"({"b": "s2.safetensors", "a": "s1.safetensors"})"));
  REQUIRE(flat.ok());
  CHECK(Entries(*flat) == std::vector<std::pair<std::string, std::string>>{
                              {"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
}

}  // namespace
}  // namespace loadstone
