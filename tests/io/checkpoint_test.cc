// Checkpoint::Open on Hugging Face layouts: files, indexes, variants, subfolders, and the index
// consistency rules.
#include "loadstone/checkpoint.h"

#include <chrono>
#include <filesystem>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "loadstone/writer.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

using testing::TempDir;

const std::vector<std::byte> kFour(4);

void WriteFile(const TempDir& dir, const std::string& name, std::vector<std::string> tensors) {
  std::vector<TensorToWrite> ts;
  for (auto& t : tensors) ts.push_back({t, DType::kF32, {1}, kFour, {}});
  std::filesystem::create_directories(std::filesystem::path(dir.Path(name)).parent_path());
  REQUIRE(WriteSafetensors(dir.Path(name), ts).ok());
}

std::string Index(const std::vector<std::pair<std::string, std::string>>& map) {
  std::string json = R"({"metadata":{"total_size":0},"weight_map":{)";
  for (size_t i = 0; i < map.size(); ++i) {
    json += fmt::format(R"({}"{}":"{}")", i ? "," : "", map[i].first, map[i].second);
  }
  return json + "}}";
}

TEST_CASE("checkpoint: a folder with model.safetensors") {
  TempDir dir;
  WriteFile(dir, "model.safetensors", {"a", "b"});
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  CHECK(ckpt->tensors().size() == 2);
  CHECK_THAT(ckpt->resolution(), Catch::Contains("model.safetensors"));
}

TEST_CASE("checkpoint: a sharded folder keeps shards separate, in file then offset order") {
  TempDir dir;
  WriteFile(dir, "model-00001-of-00002.safetensors", {"x", "a"});
  WriteFile(dir, "model-00002-of-00002.safetensors", {"c", "b"});
  dir.Write("model.safetensors.index.json",
            Index({{"x", "model-00001-of-00002.safetensors"}, {"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00002-of-00002.safetensors"}, {"c", "model-00002-of-00002.safetensors"}}));
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  REQUIRE(ckpt->files().size() == 2);
  std::vector<std::string> names;
  for (const auto& t : ckpt->tensors()) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"a", "x", "b", "c"});
  CHECK(ckpt->Find("c")->file == 1);
  CHECK(ckpt->index_path() == dir.Path("model.safetensors.index.json"));
  // The index file given directly gives the same catalog.
  auto direct = Checkpoint::Open(dir.Path("model.safetensors.index.json"));
  REQUIRE(direct.ok());
  CHECK(direct->tensors().size() == 4);
}

TEST_CASE("checkpoint: variants, legacy variant index names and subfolders") {
  TempDir dir;
  WriteFile(dir, "model.safetensors", {"plain"});
  WriteFile(dir, "model.fp16.safetensors", {"half"});
  auto fp16 = Checkpoint::Open(dir.path(), {.variant = "fp16"});
  REQUIRE(fp16.ok());
  CHECK(fp16->Find("half") != nullptr);

  WriteFile(dir, "unet/diffusion_pytorch_model.fp16-00001-of-00002.safetensors", {"u1"});
  WriteFile(dir, "unet/diffusion_pytorch_model.fp16-00002-of-00002.safetensors", {"u2"});
  dir.Write("unet/diffusion_pytorch_model.safetensors.index.fp16.json",
            Index({{"u1", "diffusion_pytorch_model.fp16-00001-of-00002.safetensors"},
                   {"u2", "diffusion_pytorch_model.fp16-00002-of-00002.safetensors"}}));
  auto unet = Checkpoint::Open(dir.path(), {.variant = "fp16", .subfolder = "unet"});
  REQUIRE(unet.ok());
  CHECK(unet->files().size() == 2);

  WriteFile(dir, "vae/diffusion_pytorch_model-00001-of-00001.fp16.safetensors", {"v"});
  dir.Write("vae/diffusion_pytorch_model.fp16.safetensors.index.json",
            Index({{"v", "diffusion_pytorch_model-00001-of-00001.fp16.safetensors"}}));
  auto vae = Checkpoint::Open(dir.path(), {.variant = "fp16", .subfolder = "vae"});
  REQUIRE(vae.ok());
  CHECK(vae->Find("v") != nullptr);

  auto missing = Checkpoint::Open(dir.path(), {.variant = "int8"});
  CHECK(missing.status().code() == StatusCode::kNotFound);
  auto no_sub = Checkpoint::Open(dir.path(), {.subfolder = "text_encoder"});
  CHECK(no_sub.status().code() == StatusCode::kNotFound);
}

TEST_CASE("checkpoint: the single file wins over the index, and the choice is reported") {
  TempDir dir;
  WriteFile(dir, "model.safetensors", {"a"});
  WriteFile(dir, "model-00001-of-00001.safetensors", {"b"});
  dir.Write("model.safetensors.index.json", Index({{"b", "model-00001-of-00001.safetensors"}}));
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE(ckpt.ok());
  CHECK(ckpt->Find("a") != nullptr);
  CHECK_THAT(ckpt->resolution(), Catch::Contains("not used: model.safetensors.index.json"));
}

TEST_CASE("checkpoint: two checkpoints of the same rank are ambiguous") {
  TempDir dir;
  WriteFile(dir, "model.safetensors", {"a"});
  WriteFile(dir, "diffusion_pytorch_model.safetensors", {"b"});
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE_FALSE(ckpt.ok());
  CHECK(ckpt.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(ckpt.status().message()), Catch::Contains("diffusion_pytorch_model"));
}

TEST_CASE("checkpoint: index consistency rules") {
  auto open_with = [](const std::vector<std::pair<std::string, std::string>>& map,
                      StatusCode code, std::string_view needle) {
    TempDir dir;
    WriteFile(dir, "s1.safetensors", {"a", "b"});
    WriteFile(dir, "s2.safetensors", {"c"});
    dir.Write("model.safetensors.index.json", Index(map));
    auto ckpt = Checkpoint::Open(dir.path());
    REQUIRE_FALSE(ckpt.ok());
    INFO(ckpt.status().ToString());
    CHECK(ckpt.status().code() == code);
    CHECK_THAT(std::string(ckpt.status().message()), Catch::Contains(std::string(needle)));
  };
  // A shard named by the index does not exist.
  open_with({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "gone.safetensors"}},
            StatusCode::kNotFound, "gone.safetensors");
  // A mapped tensor is not in its shard.
  open_with({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"},
             {"d", "s2.safetensors"}},
            StatusCode::kCorruption, "'d'");
  // A shard tensor is missing from the map.
  open_with({{"a", "s1.safetensors"}, {"c", "s2.safetensors"}}, StatusCode::kCorruption,
            "does not list");
  // A tensor mapped to the wrong shard.
  open_with({{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"c", "s2.safetensors"}},
            StatusCode::kCorruption, "'b'");
  // A shard name that leaves the folder.
  open_with({{"a", "../s1.safetensors"}}, StatusCode::kCorruption, "not a file inside");
}

TEST_CASE("checkpoint: a tensor in two shards is rejected") {
  TempDir dir;
  WriteFile(dir, "s1.safetensors", {"a"});
  WriteFile(dir, "s2.safetensors", {"a"});
  dir.Write("model.safetensors.index.json",
            R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  REQUIRE_FALSE(ckpt.ok());
  CHECK_THAT(std::string(ckpt.status().message()), Catch::Contains("two shards"));
}

TEST_CASE("checkpoint: duplicate keys in the index are rejected") {
  TempDir dir;
  WriteFile(dir, "s1.safetensors", {"a"});
  dir.Write("model.safetensors.index.json",
            R"({"weight_map":{"a":"s1.safetensors","a":"s1.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  CHECK(ckpt.status().code() == StatusCode::kCorruption);
}

TEST_CASE("checkpoint: a flat index map is accepted") {
  TempDir dir;
  WriteFile(dir, "s1.safetensors", {"a"});
  dir.Write("model.safetensors.index.json", R"({"a":"s1.safetensors"})");
  REQUIRE(Checkpoint::Open(dir.path()).ok());
}

TEST_CASE("checkpoint: missing paths and unsupported formats") {
  TempDir dir;
  CHECK(Checkpoint::Open(dir.Path("nope")).status().code() == StatusCode::kNotFound);
  CHECK(Checkpoint::Open(dir.path()).status().code() == StatusCode::kNotFound);
  // A .bin is read now (tests/runtime/pipeline/torch_bin_test.cc): two bytes are no archive.
  dir.Write("pytorch_model.bin", "PK");
  CHECK(Checkpoint::Open(dir.path()).status().code() == StatusCode::kCorruption);
  CHECK(Checkpoint::Open(dir.Path("pytorch_model.bin")).status().code() ==
        StatusCode::kCorruption);
  dir.Write("model.ckpt", "x");
  CHECK(Checkpoint::Open(dir.Path("model.ckpt")).status().code() == StatusCode::kUnsupported);
}

TEST_CASE("checkpoint: a 100k-tensor header opens in bounded time") {
  TempDir dir;
  std::vector<TensorToWrite> ts;
  ts.reserve(100'000);
  for (int i = 0; i < 100'000; ++i) {
    ts.push_back({fmt::format("model.layers.{}.mlp.w{}", i / 10, i % 10), DType::kBF16, {2}, kFour, {}});
  }
  REQUIRE(WriteSafetensors(dir.Path("many.safetensors"), ts).ok());
  const auto start = std::chrono::steady_clock::now();
  auto ckpt = Checkpoint::Open(dir.Path("many.safetensors"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(ckpt.ok());
  CHECK(ckpt->tensors().size() == 100'000);
  // The time is printed, not asserted: bench/README.md records it.
  WARN(fmt::format("opened a 100k-tensor header in {:.3f} s", seconds));
}

}  // namespace
}  // namespace loadstone
