// Every case of shared/specs/safetensors.md, through the real file path (ReadSafetensorsHeader).
#include "io/formats/safetensors.h"

#include <chrono>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "testing/temp_dir.h"

namespace loadstone::io {
namespace {

using testing::LE64;
using testing::SafetensorsBytes;
using testing::TempDir;

Result<SafetensorsHeader> ParseBytes(const std::string& bytes) {
  TempDir dir;
  const std::string path = dir.Write("t.safetensors", bytes);
  auto file = File::OpenForRead(path);
  REQUIRE(file.ok());
  return ReadSafetensorsHeader(*file);
}

// The message of a rejection must start with the reference's error name.
void RequireRejected(const std::string& bytes, std::string_view reference_error) {
  auto header = ParseBytes(bytes);
  REQUIRE_FALSE(header.ok());
  CHECK(header.status().code() == StatusCode::kCorruption);
  INFO(header.status().ToString());
  CHECK(header.status().message().substr(0, reference_error.size()) == reference_error);
}

const std::string kFirst = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";

TEST_CASE("safetensors spec: a 2x2 I32 tensor is accepted with absolute offsets") {
  REQUIRE(kFirst.size() == 60);
  auto header = ParseBytes(SafetensorsBytes(kFirst, 16));
  REQUIRE(header.ok());
  REQUIRE(header->tensors.size() == 1);
  const TensorInfo& t = header->tensors[0];
  CHECK(t.name == "test");
  CHECK(t.dtype == DType::kI32);
  CHECK(t.shape == std::vector<uint64_t>{2, 2});
  CHECK(t.offset == 68);
  CHECK(t.nbytes == 16);
  CHECK(header->data_start == 68);
}

TEST_CASE("safetensors spec: scalar and empty tensors") {
  auto scalar = ParseBytes(
      SafetensorsBytes(R"({"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})", 4));
  REQUIRE(scalar.ok());
  CHECK(scalar->tensors[0].shape.empty());
  CHECK(scalar->tensors[0].nbytes == 4);

  auto empty = ParseBytes(
      SafetensorsBytes(R"({"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}})", 0));
  REQUIRE(empty.ok());
  CHECK(empty->tensors[0].nbytes == 0);
}

TEST_CASE("safetensors spec: several zero-sized tensors may share [k,k]") {
  auto header = ParseBytes(SafetensorsBytes(
      R"({"u":{"dtype":"I32","shape":[0],"data_offsets":[0,0]},)"
      R"("t":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
      R"("v":{"dtype":"I32","shape":[0],"data_offsets":[0,0]}})",
      4));
  REQUIRE(header.ok());
  CHECK(header->tensors.size() == 3);
}

TEST_CASE("safetensors spec: offsets that disagree with the shape → TensorInvalidInfo") {
  RequireRejected(
      SafetensorsBytes(R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}})", 4),
      "TensorInvalidInfo");
}

TEST_CASE("safetensors spec: ten tensors on the same bytes → InvalidOffset") {
  std::string json = "{";
  for (int i = 0; i < 10; ++i) {
    json += fmt::format(R"({}"weight_{}":{{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                        i ? "," : "", i);
  }
  json += "}";
  RequireRejected(SafetensorsBytes(json, 16), "InvalidOffset");
}

TEST_CASE("safetensors spec: trailing bytes and missing bytes → MetadataIncompleteBuffer") {
  RequireRejected(SafetensorsBytes(kFirst, 16) + "extra_bogus_data_for_polyglot_file",
                  "MetadataIncompleteBuffer");
  RequireRejected(SafetensorsBytes(kFirst, 14), "MetadataIncompleteBuffer");
}

TEST_CASE("safetensors spec: length prefix checks") {
  RequireRejected(std::string("\x3C\x00\x00\x00\x00\xFF\xFF\xFF", 8) + kFirst +
                      std::string(16, '\0'),
                  "HeaderTooLarge");
  RequireRejected("", "HeaderTooSmall");
  RequireRejected("1234567", "HeaderTooSmall");
  RequireRejected(LE64(60), "InvalidHeaderLength");
  RequireRejected(LE64(1) + "\xFF", "InvalidHeader");
  RequireRejected(LE64(1) + "{", "InvalidHeaderDeserialization");
}

TEST_CASE("safetensors spec: JSON whitespace around the header is accepted") {
  auto a = ParseBytes(LE64(6) + "{}\x0D\x20\x09\x0A");
  REQUIRE(a.ok());
  CHECK(a->tensors.empty());
  auto b = ParseBytes(LE64(6) + "\x09\x0A{}\x0D\x20");
  REQUIRE(b.ok());
  CHECK(b->tensors.empty());
}

TEST_CASE("safetensors spec: shapes whose element count overflows → ValidationOverflow") {
  const std::string a =
      R"({"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}})";
  REQUIRE(a.size() == 79);
  RequireRejected(SafetensorsBytes(a, 16), "ValidationOverflow");
  const std::string b =
      R"({"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}})";
  REQUIRE(b.size() == 78);
  RequireRejected(SafetensorsBytes(b, 16), "ValidationOverflow");
}

TEST_CASE("safetensors spec: a header that lies about its data is rejected") {
  RequireRejected(SafetensorsBytes(
                      R"({"liar":{"dtype":"F32","shape":[1024,1024],"data_offsets":[0,4194304]}})",
                      1),
                  "MetadataIncompleteBuffer");
}

TEST_CASE("safetensors spec: a length prefix overwritten by 1000 is rejected") {
  std::string bytes = SafetensorsBytes(kFirst, 16);
  bytes.replace(0, 8, LE64(1000));
  auto header = ParseBytes(bytes);
  REQUIRE_FALSE(header.ok());
  CHECK(header.status().code() == StatusCode::kCorruption);
}

TEST_CASE("safetensors spec: 100k tensors on the same offsets are rejected quickly") {
  std::string json = "{";
  for (int i = 0; i < 100'000; ++i) {
    json += fmt::format(R"({}"t{}":{{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                        i ? "," : "", i);
  }
  json += "}";
  const auto start = std::chrono::steady_clock::now();
  RequireRejected(SafetensorsBytes(json, 16), "InvalidOffset");
  // Not a timing threshold on the machine: a quadratic check would take minutes, not seconds.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("safetensors: sub-byte dtypes must end on a byte boundary") {
  RequireRejected(
      SafetensorsBytes(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
      "MisalignedSlice");
  auto ok = ParseBytes(
      SafetensorsBytes(R"({"t":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2));
  REQUIRE(ok.ok());
  CHECK(ok->tensors[0].dtype == DType::kF4);
}

TEST_CASE("safetensors: the schema is enforced as the reference enforces it") {
  auto reject = [](std::string_view json, size_t data) {
    RequireRejected(SafetensorsBytes(json, data), "InvalidHeaderDeserialization");
  };
  reject(R"([])", 0);
  reject(R"({"t":{"dtype":"XX","shape":[8],"data_offsets":[0,8]}})", 8);
  reject(R"({"t":{"dtype":"I32","shape":[],"data_offsets":[0,4,5]}})", 4);
  reject(R"({"t":{"dtype":"I32","shape":[],"data_offsets":[0]}})", 4);
  reject(R"({"t":{"dtype":"I32","shape":[],"dtype":"I32","data_offsets":[0,4]}})", 4);
  reject(R"({"t":{"dtype":"I32","shape":[-0],"data_offsets":[0,4]}})", 4);
  reject(R"({"t":{"dtype":"I32","shape":[1.0],"data_offsets":[0,4]}})", 4);
  reject(R"({"t":{"dtype":"I32","shape":[-1],"data_offsets":[0,4]}})", 4);
  reject(R"({"t":{"dtype":"I32","data_offsets":[0,4]}})", 4);
  reject(R"({"t":{"shape":[],"data_offsets":[0,4]}})", 4);
  reject(R"({"t":"x"})", 0);
  reject(R"({"__metadata__":{"a":1}})", 0);
  reject(R"({"__metadata__":{"a":null}})", 0);
  reject(R"({"__metadata__":[]})", 0);
  reject(R"({"t":{"dtype":"I32","shape":[],"data_offsets":[0,4]}} x)", 4);
  reject(R"({"t":{"dtype":"I32","shape":[99999999999999999999999],"data_offsets":[0,4]}})", 4);
}

TEST_CASE("safetensors: unknown tensor fields and null metadata are accepted") {
  auto header = ParseBytes(SafetensorsBytes(
      R"({"__metadata__":null,"t":{"dtype":"I32","shape":[],"data_offsets":[0,4],)"
      R"("extra":{"x":[1,{"y":null}]}}})",
      4));
  REQUIRE(header.ok());
  CHECK(header->metadata.empty());
  auto meta = ParseBytes(LE64(34) + R"({"__metadata__":{"format":"pt"}}  )");
  REQUIRE(meta.ok());
  CHECK(meta->metadata.at("format") == "pt");
}

TEST_CASE("safetensors: nesting deeper than the reference's recursion limit is rejected") {
  auto nested = [](int depth) {
    return R"({"t":{"dtype":"I32","shape":[],"data_offsets":[0,4],"x":)" +
           std::string(depth, '[') + std::string(depth, ']') + "}}";
  };
  REQUIRE(ParseBytes(SafetensorsBytes(nested(125), 4)).ok());
  RequireRejected(SafetensorsBytes(nested(126), 4), "InvalidHeaderDeserialization");
}

TEST_CASE("safetensors: duplicate keys are rejected (the reference keeps the last silently)") {
  // Deliberate difference from the reference implementation, see specs/safetensors.md.
  RequireRejected(SafetensorsBytes(R"({"t":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
                                   R"("t":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                                   4),
                  "DuplicateKey");
  RequireRejected(SafetensorsBytes(R"({"__metadata__":{"a":"b","a":"c"}})", 0), "DuplicateKey");
}

TEST_CASE("safetensors: the first error is the one met first, a repeated key included") {
  // The header is read once without checking names as they come, then again checking when
  // anything is wrong: a repeat is still refused where it stands, before what follows it.
  const std::string t = R"("t":{"dtype":"I32","shape":[],"data_offsets":[0,4]})";
  RequireRejected(SafetensorsBytes("{" + t + "," + t + R"(,"u":{"dtype":"NOPE"}})", 4),
                  "DuplicateKey");
  RequireRejected(SafetensorsBytes(R"({"u":{"dtype":"NOPE"},)" + t + "," + t + "}", 4),
                  "InvalidHeaderDeserialization");
  RequireRejected(SafetensorsBytes(R"({"__metadata__":{},"__metadata__":null,)" + t + "}", 4),
                  "DuplicateKey");
  RequireRejected(SafetensorsBytes("{" + t + "," + t + "}", 4), "DuplicateKey");
  const auto header = ParseBytes(SafetensorsBytes("{" + t + "," + t + R"(,"u":1})", 4));
  REQUIRE_FALSE(header.ok());
  CHECK_THAT(std::string(header.status().message()), Catch::Contains("key 't' appears twice"));
}

TEST_CASE("safetensors: messages name the file and the tensor") {
  auto header = ParseBytes(
      SafetensorsBytes(R"({"w3":{"dtype":"I32","shape":[2,2],"data_offsets":[16,32]}})", 32));
  REQUIRE_FALSE(header.ok());
  const std::string msg(header.status().message());
  CHECK_THAT(msg, Catch::Contains("InvalidOffset: tensor 'w3' data_offsets [16, 32]"));
  CHECK_THAT(msg, Catch::Contains("t.safetensors"));
}

}  // namespace
}  // namespace loadstone::io
