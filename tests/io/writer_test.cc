// The writer's layout against the reference writer's rules, and round trips through the reader.
#include "loadstone/writer.h"

#include <filesystem>
#include <fstream>
#include <numeric>

#include <catch2/catch.hpp>

#include "loadstone/checkpoint.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

using testing::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::byte> Iota(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(i * 7 + 3);
  return v;
}

TEST_CASE("writer: header is sorted by dtype descending then name, padded to 8 bytes") {
  TempDir dir;
  auto a = Iota(8), b = Iota(4), c = Iota(16), d = Iota(2);
  std::vector<TensorToWrite> tensors = {
      {"b_half", DType::kF16, {2}, b, {}},
      {"a_float", DType::kF32, {2}, a, {}},
      {"z_long", DType::kI64, {2}, c, {}},
      {"a2_float", DType::kF32, {2}, a, {}},
      {"u8", DType::kU8, {2}, d, {}},
  };
  const std::string path = dir.Path("m.safetensors");
  REQUIRE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  const std::string bytes = ReadAll(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK(n % 8 == 0);
  const std::string header = bytes.substr(8, n);
  // Same text as the reference writer produces for these tensors (safetensors 0.8.0).
  const std::string expected =
      R"({"__metadata__":{"format":"pt"},"z_long":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("a2_float":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("a_float":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},)"
      R"("b_half":{"dtype":"F16","shape":[2],"data_offsets":[32,36]},)"
      R"("u8":{"dtype":"U8","shape":[2],"data_offsets":[36,38]}})";
  CHECK(header.substr(0, expected.size()) == expected);
  CHECK(header.find_first_not_of(' ', expected.size()) == std::string::npos);
  CHECK(bytes.size() == 8 + n + 38);
  CHECK(bytes.substr(8 + n, 16) == std::string(reinterpret_cast<const char*>(c.data()), 16));
}

TEST_CASE("writer: round trip of one file through Checkpoint::Open") {
  TempDir dir;
  auto w = Iota(24), s = Iota(2);
  std::vector<TensorToWrite> tensors = {{"w", DType::kBF16, {3, 4}, w, {}},
                                        {"s", DType::kI16, {}, s, {}}};
  REQUIRE(WriteSafetensors(dir.Path("x.safetensors"), tensors).ok());
  auto ckpt = Checkpoint::Open(dir.Path("x.safetensors"));
  REQUIRE(ckpt.ok());
  REQUIRE(ckpt->tensors().size() == 2);
  const TensorInfo* t = ckpt->Find("w");
  REQUIRE(t != nullptr);
  CHECK(t->shape == std::vector<uint64_t>{3, 4});
  CHECK(t->nbytes == 24);
  const std::string bytes = ReadAll(dir.Path("x.safetensors"));
  CHECK(bytes.substr(t->offset, 24) == std::string(reinterpret_cast<const char*>(w.data()), 24));
}

TEST_CASE("writer: sharding follows max_shard_size in tensor order and writes an index") {
  TempDir dir;
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 5; ++i) data.push_back(Iota(400));
  for (int i = 0; i < 5; ++i) {
    tensors.push_back({"layers." + std::to_string(i) + ".w", DType::kF32, {100}, data[i], {}});
  }
  ShardedWriteOptions options;
  options.max_shard_size = 1000;  // two tensors per shard
  auto written = WriteShardedSafetensors(dir.path(), tensors, options);
  REQUIRE(written.ok());
  REQUIRE(written->size() == 4);
  CHECK(std::filesystem::path((*written)[0]).filename() == "model-00001-of-00003.safetensors");
  CHECK(std::filesystem::path(written->back()).filename() == "model.safetensors.index.json");
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  CHECK(ckpt->files().size() == 3);
  CHECK(ckpt->tensors().size() == 5);
  CHECK(ckpt->Find("layers.4.w")->file == 2);
  CHECK(ckpt->total_bytes() == 2000);
}

TEST_CASE("writer: a fill callback streams large tensors") {
  TempDir dir;
  TensorToWrite t{"big", DType::kU8, {20u << 20}, {}, {}};
  t.fill = [](uint64_t offset, std::span<std::byte> chunk) {
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<std::byte>((offset + i) % 251);
    return Status::OK();
  };
  REQUIRE(WriteSafetensors(dir.Path("big.safetensors"), {t}).ok());
  auto ckpt = Checkpoint::Open(dir.Path("big.safetensors"));
  REQUIRE(ckpt.ok());
  const std::string bytes = ReadAll(dir.Path("big.safetensors"));
  const uint64_t at = ckpt->tensors()[0].offset + (9u << 20) + 5;
  CHECK(static_cast<uint8_t>(bytes[at]) == ((9u << 20) + 5) % 251);
}

TEST_CASE("writer: bad input is refused") {
  TempDir dir;
  auto d = Iota(3);
  CHECK(WriteSafetensors(dir.Path("a"), {{"x", DType::kF32, {1}, d, {}}}).code() ==
        StatusCode::kInvalidArgument);
  auto e = Iota(4);
  CHECK(WriteSafetensors(dir.Path("b"), {{"x", DType::kF32, {1}, e, {}},
                                         {"x", DType::kF32, {1}, e, {}}})
            .code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loadstone
