// GGUF files against what the `gguf` package (llama.cpp's Python writer and reader) says of
// them: the fixtures and their manifest come from tests/fixtures/make_gguf_fixtures.py; no
// Python is needed here. Valid files list and load with the reader's types, shapes and bytes;
// each malformed one is refused naming the rule it breaks.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/platform.h"
#include "testing/file_bytes.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/gguf";

nlohmann::json Manifest() {
  std::ifstream in(kFixtures / "manifest.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::vector<uint64_t> Reversed(std::vector<uint64_t> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

TEST_CASE("gguf: valid files list and load as the gguf package reads them") {
  const auto manifest = Manifest();
  REQUIRE(manifest["valid"].size() >= 8);
  for (const auto& expected : manifest["valid"]) {
    const std::string path = (kFixtures / expected["path"].get<std::string>()).string();
    INFO(path);
    // A split part is checked against its own reader view: open it alone through its set, and
    // look up its tensors there.
    auto ckpt = Checkpoint::Open(path);
    REQUIRE(ckpt.ok());
    CHECK(ckpt->format() == CheckpointFormat::kGguf);
    auto plan = Plan(*ckpt);
    REQUIRE(plan.ok());
    Loader loader;
    LoadHandle load = loader.Load(*ckpt, *plan);
    for (const auto& want : expected["tensors"]) {
      const std::string name = want["name"];
      INFO("tensor " << name);
      const TensorInfo* t = ckpt->Find(name);
      REQUIRE(t != nullptr);
      const auto ne = want["ne"].get<std::vector<uint64_t>>();
      CHECK(t->nbytes == want["n_bytes"].get<uint64_t>());
      if (t->packed) {
        CHECK(t->packed->scheme == want["type"].get<std::string>());
        CHECK(t->packed->element_shape == Reversed(ne));
        CHECK(t->shape == want["data_shape"].get<std::vector<uint64_t>>());
        CHECK(t->dtype == DType::kU8);
      } else {
        CHECK(SafetensorsName(t->dtype) == want["type"].get<std::string>());
        CHECK(t->shape == Reversed(ne));
      }
      const Tensor& loaded = load.Tensor(name).get();
      CHECK(loaded.nbytes() == t->nbytes);
      CHECK(crc32(0, reinterpret_cast<const Bytef*>(loaded.data()),
                  static_cast<uInt>(loaded.nbytes())) == want["crc32"].get<uint32_t>());
    }
    REQUIRE(load.Done().get().ok());
    CHECK(load.backend().find("io_uring") != std::string::npos);
    // Scalar metadata as the reader reads it (a split set keeps its first part's values).
    if (expected["path"].get<std::string>().find("split/") == std::string::npos) {
      for (const auto& [key, value] : expected["metadata"].items()) {
        INFO("metadata " << key);
        const auto it = ckpt->metadata().find(key);
        REQUIRE(it != ckpt->metadata().end());
        if (value.is_string()) {
          CHECK(it->second == value.get<std::string>());
        } else if (value.is_boolean()) {
          CHECK(it->second == (value.get<bool>() ? "true" : "false"));
        } else if (value.is_number_integer()) {
          CHECK(it->second == value.dump());
        } else {
          CHECK(std::strtod(it->second.c_str(), nullptr) == Approx(value.get<double>()));
        }
      }
    }
  }
}

TEST_CASE("gguf: a split set opens as one checkpoint from any of its parts") {
  for (int part = 1; part <= 3; ++part) {
    const std::string path =
        (kFixtures / "split" / ("model-0000" + std::to_string(part) + "-of-00003.gguf")).string();
    auto ckpt = Checkpoint::Open(path);
    REQUIRE(ckpt.ok());
    CHECK(ckpt->files().size() == 3);
    CHECK(ckpt->tensors().size() == 5);
    CHECK(ckpt->Find("blk.2.w0") != nullptr);
  }
  TempDir dir;
  for (int part : {1, 3}) {
    const std::string name = "model-0000" + std::to_string(part) + "-of-00003.gguf";
    fs::copy_file(kFixtures / "split" / name, dir.Path(name));
  }
  auto missing = Checkpoint::Open(dir.Path("model-00001-of-00003.gguf"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("split 2 of 3"));
  // A part renamed out of its set: its own keys say what it is.
  fs::copy_file(kFixtures / "split" / "model-00002-of-00003.gguf", dir.Path("loose.gguf"));
  auto loose = Checkpoint::Open(dir.Path("loose.gguf"));
  REQUIRE_FALSE(loose.ok());
  CHECK_THAT(std::string(loose.status().message()), Catch::Contains("part 1 of a 3-file"));
}

TEST_CASE("gguf: every malformed file is refused, naming the rule it breaks") {
  const auto manifest = Manifest();
  REQUIRE(manifest["malformed"].size() >= 30);
  for (const auto& expected : manifest["malformed"]) {
    const std::string path = (kFixtures / expected["path"].get<std::string>()).string();
    INFO(path);
    auto ckpt = Checkpoint::Open(path);
    REQUIRE_FALSE(ckpt.ok());
    CHECK(ckpt.status().code() == StatusCode::kCorruption);
    CHECK_THAT(std::string(ckpt.status().message()),
               Catch::Contains(expected["message"].get<std::string>()));
  }
}

}  // namespace
}  // namespace loadstone

namespace loadstone {
namespace {

using testing::FileBytes;

std::vector<std::byte> HostBytes(const Tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  REQUIRE(t.CopyToHost(out).ok());
  return out;
}

}  // namespace

// tests/fixtures/gguf/dequant (make_gguf_dequant_fixtures.py): every block type, loaded with a
// target dtype, equals gguf.quants.dequantize (f32) and torch's cast of it (bf16, f16) bit for
// bit — on the CPU and on a simulated GPU, in small reads that cut the tensors into pieces of
// whole blocks; --keep-packed loads the bytes as stored.
TEST_CASE("gguf: quantized blocks dequantize on load into the target dtype, or stay packed") {
  const fs::path dir = kFixtures / "dequant";
  auto ckpt = Checkpoint::Open((dir / "blocks.gguf").string());
  REQUIRE(ckpt.ok());
  auto expected = Checkpoint::Open((dir / "expected.safetensors").string());
  REQUIRE(expected.ok());
  const auto [suffix, dtype] = GENERATE(std::pair{".f32", DType::kF32},
                                        std::pair{".bf16", DType::kBF16},
                                        std::pair{".f16", DType::kF16});
  const std::string map = GENERATE(as<std::string>{}, "cpu", "sim");
  INFO(suffix << " on " << map);
  PlanOptions opt;
  opt.dtype = dtype;
  // Pieces of whole blocks whose decoded size fits 4 KiB too: 8 Q4_K blocks a read into bf16, 4
  // into f32, and so on.
  opt.max_chunk = 4096;
  opt.coalesce_below = 1;
  if (map == "sim") {
    opt.platform = Platform::Simulated(SimulatedMachine{{1ULL << 30}, 8ULL << 30}.WithDevices());
    opt.device_map = "auto";
  }
  auto plan = Plan(*ckpt, opt);
  REQUIRE(plan.ok());
  for (const ReadChunk& r : plan->reads) {
    const TensorInfo& src = ckpt->tensors()[plan->tensors[r.tensors.front()].source];
    if (r.tensors.size() > 1) continue;  // small tensors coalesced whole
    CHECK(r.length % src.packed->block_bytes == 0);
    CHECK(r.length / src.packed->block_bytes * src.packed->block_elems * DTypeBits(dtype) / 8 <= 4096);
  }
  for (const TensorPlan& tp : plan->tensors) {
    CHECK(tp.conversion == Conversion::kDequantBlocks);
    CHECK(tp.dtype == dtype);
    CHECK(tp.nbytes == ckpt->tensors()[tp.source].element_count() * DTypeBits(dtype) / 8);
  }
  LoaderOptions lo;
  lo.platform = opt.platform;
  Loader loader(lo);
  if (map == "sim") {
    for (uint32_t i = 0; i < plan->tensors.size(); ++i) CHECK(plan->device_of(i).is_gpu());
  }
  LoadHandle load = loader.Load(*ckpt, *plan);
  const Status loaded = load.Done().get();
  INFO(loaded.ToString());
  REQUIRE(loaded.ok());
  REQUIRE(load.Tensors().size() == 20);
  for (const Tensor& t : load.Tensors()) {
    INFO(t.name());
    const TensorInfo* want = expected->Find(t.name() + suffix);
    REQUIRE(want != nullptr);
    CHECK(t.dtype() == dtype);
    CHECK(t.shape() == want->shape);  // the element shape, not the bytes'
    CHECK(HostBytes(t) == FileBytes(*expected, *want));
  }

  PlanOptions packed = opt;
  packed.keep_packed = true;
  auto kept = Plan(*ckpt, packed);
  REQUIRE(kept.ok());
  LoadHandle raw = loader.Load(*ckpt, *kept);
  REQUIRE(raw.Done().get().ok());
  for (const Tensor& t : raw.Tensors()) {
    INFO(t.name());
    const TensorInfo* info = ckpt->Find(t.name());
    CHECK(t.dtype() == DType::kU8);
    CHECK(t.shape() == info->shape);
    CHECK(HostBytes(t) == FileBytes(*ckpt, *info));
  }
}

TEST_CASE("gguf: a hand-made plan whose read cuts a block is refused before any read") {
  auto ckpt = Checkpoint::Open((kFixtures / "dequant" / "blocks.gguf").string());
  REQUIRE(ckpt.ok());
  PlanOptions opt;
  opt.dtype = DType::kF32;
  opt.max_chunk = 4096;
  opt.coalesce_below = 1;
  auto plan = Plan(*ckpt, opt);
  REQUIRE(plan.ok());
  auto cut = std::find_if(plan->reads.begin(), plan->reads.end(), [&](const ReadChunk& r) {
    return r.tensors.size() == 1 && r.length > 1 &&
           ckpt->tensors()[plan->tensors[r.tensors[0]].source].packed->block_bytes > 1;
  });
  REQUIRE(cut != plan->reads.end());
  // Moves one byte from this read to the next one of the same tensor (or drops it): either way
  // the piece no longer ends on a block.
  cut->length -= 1;
  Loader loader;
  const Status s = loader.Load(*ckpt, *plan).Done().get();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("cuts its") || Catch::Contains("read exactly once"));
}

TEST_CASE("gguf: the device map sizes a dequantized weight by its target dtype") {
  auto ckpt = Checkpoint::Open((kFixtures / "dequant" / "blocks.gguf").string());
  REQUIRE(ckpt.ok());
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  auto plan = Plan(*ckpt, opt);
  REQUIRE(plan.ok());
  uint64_t elements = 0, stored = 0;
  for (const TensorInfo& t : ckpt->tensors()) {
    elements += t.element_count();
    stored += t.nbytes;
  }
  CHECK(plan->placed_bytes == elements * 2);
  CHECK(plan->read_bytes >= stored);  // and the alignment gaps read with coalesced neighbours
  // A budget that holds the packed bytes but not the bf16 result sends the rest to the CPU.
  SimulatedMachine machine{{1ULL << 30}, 8ULL << 30};
  opt.platform = Platform::Simulated(machine);
  opt.device_map = "auto";
  opt.max_memory = MaxMemory{{"0", static_cast<int64_t>(stored * 2)}, {"cpu", int64_t{1} << 30}};
  auto mapped = Plan(*ckpt, opt);
  INFO(mapped.status().ToString());
  REQUIRE(mapped.ok());
  uint64_t on_gpu = 0;
  for (uint32_t i = 0; i < mapped->tensors.size(); ++i) {
    if (mapped->device_of(i).is_gpu()) on_gpu += mapped->tensors[i].nbytes;
  }
  CHECK(on_gpu <= stored * 2);
  CHECK(on_gpu < elements * 2);  // not all of it fits: sized as placed, not as stored
}

}  // namespace loadstone
