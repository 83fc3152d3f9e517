// PyTorch .bin checkpoints against what the real torch.save wrote and torch.load read back: the
// fixtures and their manifest come from tests/fixtures/make_torch_fixtures.py (torch pinned
// there); no Python is needed here. Valid files load through the same readers, plan and futures
// as safetensors and give torch.load's tensors (CRC-32, shape, dtype); hostile ones are refused
// with the message the manifest names, and their payloads never run.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/platform.h"
#include "loadstone/platform.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/torch";

nlohmann::json Manifest() {
  std::ifstream in(kFixtures / "manifest.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

uint32_t Crc(const Tensor& t) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(t.data()), static_cast<uInt>(t.nbytes())));
}

// Loads `path` with `options` and checks every tensor against the manifest's entry.
void LoadAndCompare(const nlohmann::json& expected, const PlanOptions& options) {
  const std::string path = (kFixtures / expected["path"].get<std::string>()).string();
  auto ckpt = Checkpoint::Open(path);
  REQUIRE(ckpt.ok());
  CHECK(ckpt->format() == CheckpointFormat::kPyTorch);
  auto plan = Plan(*ckpt, options);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(*ckpt, *plan);
  // Each tensor's own future, as for safetensors.
  for (const auto& want : expected["tensors"]) {
    const std::string name = want["name"];
    INFO(path << " tensor " << name);
    const Tensor& t = load.Tensor(name).get();
    CHECK(SafetensorsName(t.dtype()) == want["dtype"].get<std::string>());
    CHECK(t.shape() == want["shape"].get<std::vector<uint64_t>>());
    CHECK(Crc(t) == want["crc32"].get<uint32_t>());
  }
  REQUIRE(load.Done().get().ok());
  CHECK(load.Tensors().size() == expected["tensors"].size());
  CHECK(load.backend().find("io_uring") != std::string::npos);
}

TEST_CASE("torch .bin: files torch.save wrote load as torch.load reads them") {
  const auto manifest = Manifest();
  REQUIRE(manifest["valid"].size() >= 9);
  for (const auto& expected : manifest["valid"]) {
    const std::string path = (kFixtures / expected["path"].get<std::string>()).string();
    INFO(path);
    auto ckpt = Checkpoint::Open(path);
    REQUIRE(ckpt.ok());
    std::map<std::string, const TensorInfo*> by_name;
    for (const TensorInfo& t : ckpt->tensors()) by_name[t.name] = &t;
    REQUIRE(by_name.size() == expected["tensors"].size());
    for (const auto& want : expected["tensors"]) {
      const TensorInfo* t = by_name.at(want["name"]);
      CHECK(SafetensorsName(t->dtype) == want["dtype"].get<std::string>());
      CHECK(t->shape == want["shape"].get<std::vector<uint64_t>>());
    }
    const std::string key = expected["state_dict_key"];
    if (!key.empty()) {
      const auto& w = ckpt->warnings();
      CHECK(std::any_of(w.begin(), w.end(), [&](const std::string& s) {
        return s.find("under key '" + key + "'") != std::string::npos;
      }));
    }
    LoadAndCompare(expected, PlanOptions{});
  }
}

TEST_CASE("torch .bin: in small pieces, cast, and mapped, the tensors are still torch.load's") {
  const auto manifest = Manifest();
  PlanOptions pieces;  // every tensor of 4 KiB or more in several reads
  pieces.max_chunk = 4096;
  pieces.coalesce_below = 0;
  PlanOptions mapped;
  mapped.routes.mmap = true;
  PlanOptions staged;
  staged.routes.stage_cold_reads = false;
  staged.routes.fill_fresh_pages = false;
  for (const auto& expected : manifest["valid"]) {
    INFO(expected["path"].get<std::string>());
    LoadAndCompare(expected, pieces);
    LoadAndCompare(expected, mapped);
    LoadAndCompare(expected, staged);
  }
  // A cast of strided and big-endian tensors: relayout first, then the cast.
  for (const std::string name : {"views.bin", "big_endian.bin"}) {
    auto ckpt = Checkpoint::Open((kFixtures / name).string());
    REQUIRE(ckpt.ok());
    PlanOptions bf16;
    bf16.dtype = DType::kBF16;
    auto plan16 = Plan(*ckpt, bf16);
    auto plan32 = Plan(*ckpt);
    REQUIRE(plan16.ok());
    REQUIRE(plan32.ok());
    Loader loader;
    LoadHandle a = loader.Load(*ckpt, *plan16), b = loader.Load(*ckpt, *plan32);
    REQUIRE(a.Done().get().ok());
    REQUIRE(b.Done().get().ok());
    for (const Tensor& t : b.Tensors()) {
      if (t.dtype() != DType::kF32) continue;
      const Tensor& h = a.Tensor(t.name()).get();
      REQUIRE(h.dtype() == DType::kBF16);
      INFO(name << " " << t.name());
      // bf16 of an f32, by round-to-nearest-even on the top half.
      const auto* f = reinterpret_cast<const uint32_t*>(t.data());
      const auto* g = reinterpret_cast<const uint16_t*>(h.data());
      size_t wrong = 0;
      for (uint64_t i = 0; i < t.nbytes() / 4; ++i) {
        const uint32_t bits = f[i];
        const uint32_t rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
        wrong += g[i] != static_cast<uint16_t>(rounded);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("torch .bin: a shared storage is read once and serves every tensor that views it") {
  auto ckpt = Checkpoint::Open((kFixtures / "views.bin").string());
  REQUIRE(ckpt.ok());
  // The bytes the file's storages hold: the union of the tensors' ranges.
  std::map<std::string, std::pair<uint64_t, uint64_t>> storages;
  uint64_t tensor_bytes = 0;
  for (const TensorInfo& t : ckpt->tensors()) {
    auto [it, fresh] = storages.emplace(t.storage, std::pair{t.offset, t.offset + t.nbytes});
    it->second = {std::min(it->second.first, t.offset),
                  std::max(it->second.second, t.offset + t.nbytes)};
    tensor_bytes += t.nbytes;
  }
  uint64_t storage_bytes = 0;
  for (const auto& [key, range] : storages) storage_bytes += range.second - range.first;
  REQUIRE(storage_bytes < tensor_bytes);
  const TensorInfo* a = ckpt->Find("a");
  const TensorInfo* tied = ckpt->Find("tied");
  REQUIRE(a != nullptr);
  REQUIRE(tied != nullptr);
  CHECK(a->storage == tied->storage);
  CHECK(a->offset == tied->offset);
  CHECK(ckpt->Find("a_t")->strides == std::vector<uint64_t>{1, 8});

  for (uint64_t max_chunk : {uint64_t{16} << 20, uint64_t{4096}}) {
    PlanOptions options;
    options.max_chunk = max_chunk;
    auto plan = Plan(*ckpt, options);
    REQUIRE(plan.ok());
    // The storages' bytes once each, plus the zip headers between small ones read with them.
    uint64_t planned = 0, covered = 0;
    for (const ReadChunk& r : plan->reads) {
      planned += r.length;
      std::vector<std::pair<uint64_t, uint64_t>> parts;
      for (uint32_t t : r.tensors) {
        const TensorInfo& src = ckpt->tensors()[plan->tensors[t].source];
        parts.push_back({std::max(r.offset, src.offset),
                         std::min(r.offset + r.length, src.offset + src.nbytes)});
      }
      std::sort(parts.begin(), parts.end());
      uint64_t end = 0;
      for (const auto& [lo, hi] : parts) {  // the union of what its tensors take of the read
        covered += hi > std::max(lo, end) ? hi - std::max(lo, end) : 0;
        end = std::max(end, hi);
      }
    }
    CHECK(covered == storage_bytes);
    CHECK(planned == plan->read_bytes);
    CHECK(planned < storage_bytes + 4096 * storages.size());
    Loader loader;
    LoadHandle load = loader.Load(*ckpt, *plan);
    REQUIRE(load.Done().get().ok());
    CHECK(load.progress().bytes_read == plan->read_bytes);
    uint64_t taken = 0;
    for (const RouteCount& c : load.read_stats().routes) taken += c.bytes;
    CHECK(taken == plan->read_bytes);
    // Tied weights: equal bytes, each its own tensor.
    const Tensor& x = load.Tensor("a").get();
    const Tensor& y = load.Tensor("tied").get();
    REQUIRE(x.nbytes() == y.nbytes());
    CHECK(std::equal(x.data(), x.data() + x.nbytes(), y.data()));
  }
}

TEST_CASE("torch .bin: small storages are read together, the zip headers between them too") {
  auto ckpt = Checkpoint::Open((kFixtures / "plain.bin").string());
  REQUIRE(ckpt.ok());
  std::set<std::string> storages;
  for (const TensorInfo& t : ckpt->tensors()) storages.insert(t.storage);
  REQUIRE(storages.size() >= 13);
  auto plan = Plan(*ckpt);
  REQUIRE(plan.ok());
  // One read for the small ones (their headers between them), one for the 33 KiB tensor's
  // neighbourhood at most: not one per storage.
  CHECK(plan->reads.size() <= 2);
  uint64_t tensor_bytes = 0;
  for (const TensorInfo& t : ckpt->tensors()) tensor_bytes += t.nbytes;
  CHECK(plan->read_bytes > tensor_bytes);  // the gaps are counted
  Loader loader;
  LoadHandle load = loader.Load(*ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  CHECK(load.progress().bytes_read == plan->read_bytes);
}

TEST_CASE("torch .bin: hostile and broken files are refused, naming what, and nothing runs") {
  const auto manifest = Manifest();
  const fs::path marker = manifest["marker"].get<std::string>();
  std::error_code ec;
  fs::remove(marker, ec);
  REQUIRE(manifest["refused"].size() >= 20);
  for (const auto& expected : manifest["refused"]) {
    const std::string path = (kFixtures / expected["path"].get<std::string>()).string();
    INFO(path);
    auto ckpt = Checkpoint::Open(path);
    REQUIRE_FALSE(ckpt.ok());
    CHECK(StatusCodeName(ckpt.status().code()) == expected["code"].get<std::string>());
    CHECK_THAT(std::string(ckpt.status().message()),
               Catch::Contains(expected["message"].get<std::string>()));
  }
  CHECK_FALSE(fs::exists(marker));
}

TEST_CASE("torch .bin: Hugging Face folders, shards, variants and subfolders") {
  SECTION("a 3-shard pytorch_model.bin.index.json opens as one checkpoint") {
    auto ckpt = Checkpoint::Open((kFixtures / "sharded").string());
    REQUIRE(ckpt.ok());
    CHECK(ckpt->format() == CheckpointFormat::kPyTorch);
    CHECK(ckpt->files().size() == 3);
    CHECK(ckpt->tensors().size() == 7);
    CHECK_THAT(ckpt->index_path(), Catch::EndsWith("pytorch_model.bin.index.json"));
    auto plan = Plan(*ckpt);
    REQUIRE(plan.ok());
    Loader loader;
    LoadHandle load = loader.Load(*ckpt, *plan);
    REQUIRE(load.Done().get().ok());
    CHECK(load.Tensor("lm_head.weight").get().shape() == std::vector<uint64_t>{8, 4});
  }
  SECTION("safetensors is preferred over .bin, and the choice is reported") {
    auto ckpt = Checkpoint::Open((kFixtures / "both").string());
    REQUIRE(ckpt.ok());
    CHECK(ckpt->format() == CheckpointFormat::kSafetensors);
    CHECK_THAT(ckpt->resolution(), Catch::Contains("picked model.safetensors") &&
                                       Catch::Contains("pytorch_model.bin"));
  }
  SECTION("a .bin variant") {
    OpenOptions fp16;
    fp16.variant = "fp16";
    auto ckpt = Checkpoint::Open((kFixtures / "variant").string(), fp16);
    REQUIRE(ckpt.ok());
    CHECK(ckpt->format() == CheckpointFormat::kPyTorch);
    CHECK(ckpt->tensors().at(0).dtype == DType::kF16);
    auto plain = Checkpoint::Open((kFixtures / "variant").string());
    REQUIRE_FALSE(plain.ok());
    CHECK_THAT(std::string(plain.status().message()), Catch::Contains("--variant fp16"));
  }
  SECTION("a diffusers component's diffusion_pytorch_model.bin") {
    OpenOptions unet;
    unet.subfolder = "unet";
    auto ckpt = Checkpoint::Open((kFixtures / "pipeline").string(), unet);
    REQUIRE(ckpt.ok());
    CHECK(ckpt->format() == CheckpointFormat::kPyTorch);
    CHECK(ckpt->Find("conv.weight") != nullptr);
    auto top = Checkpoint::Open((kFixtures / "pipeline").string());
    REQUIRE_FALSE(top.ok());
    CHECK_THAT(std::string(top.status().message()), Catch::Contains("--subfolder unet"));
  }
}

TEST_CASE("torch .bin: strided and big-endian tensors reach a GPU contiguous, cast or not") {
  // Simulated GPUs (host memory behind the device interface): the relayout runs on a worker,
  // then the device job copies (and casts) its output.
  LoaderOptions lo;
  lo.platform = Platform::Simulated(SimulatedMachine::Gpus(1, 1ULL << 30).WithDevices());
  Loader loader(lo);
  const auto manifest = Manifest();
  for (const auto& expected : manifest["valid"]) {
    const std::string name = expected["path"];
    if (name != "views.bin" && name != "big_endian.bin") continue;
    INFO(name);
    auto ckpt = Checkpoint::Open((kFixtures / name).string());
    REQUIRE(ckpt.ok());
    PlanOptions gpu;
    gpu.device_map = "cuda:0";
    gpu.platform = lo.platform;
    auto plan = Plan(*ckpt, gpu);
    REQUIRE(plan.ok());
    LoadHandle load = loader.Load(*ckpt, *plan);
    REQUIRE(load.Done().get().ok());
    for (const auto& want : expected["tensors"]) {
      const Tensor& t = load.Tensor(want["name"].get<std::string>()).get();
      INFO(t.name());
      CHECK(t.device() == "cuda:0");
      std::vector<std::byte> host(t.nbytes());
      REQUIRE(t.CopyToHost(host).ok());
      CHECK(crc32(0, reinterpret_cast<const Bytef*>(host.data()), static_cast<uInt>(host.size())) ==
            want["crc32"].get<uint32_t>());
    }
    // Cast on the device after the relayout: bf16 of the f32 bytes loaded on the CPU.
    gpu.dtype = DType::kBF16;
    auto plan16 = Plan(*ckpt, gpu);
    REQUIRE(plan16.ok());
    LoadHandle half = loader.Load(*ckpt, *plan16);
    REQUIRE(half.Done().get().ok());
    Loader cpu_loader;
    auto plan32 = Plan(*ckpt);
    REQUIRE(plan32.ok());
    LoadHandle full = cpu_loader.Load(*ckpt, *plan32);
    REQUIRE(full.Done().get().ok());
    for (const Tensor& f : full.Tensors()) {
      if (f.dtype() != DType::kF32) continue;
      const Tensor& h = half.Tensor(f.name()).get();
      std::vector<std::byte> bytes(h.nbytes());
      REQUIRE(h.CopyToHost(bytes).ok());
      const auto* bits = reinterpret_cast<const uint32_t*>(f.data());
      const auto* got = reinterpret_cast<const uint16_t*>(bytes.data());
      size_t wrong = 0;
      for (uint64_t i = 0; i < f.nbytes() / 4; ++i) {
        wrong += got[i] != static_cast<uint16_t>((bits[i] + 0x7FFF + ((bits[i] >> 16) & 1)) >> 16);
      }
      CHECK(wrong == 0);
    }
  }
}

}  // namespace
}  // namespace loadstone
