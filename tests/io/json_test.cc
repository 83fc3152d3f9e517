// The JSON boundary (io/formats/json_util.h) and the documents read through it: hostile numbers,
// nesting and sizes end in one clean error, never an exception, a stack overflow or a stall.
#include "io/formats/json_util.h"

#include <string>

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

}  // namespace
}  // namespace loadstone
