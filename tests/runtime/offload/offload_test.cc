// Disk offload below the CLI: WriteOffload into a folder that Checkpoint::Open reads back,
// OffloadStore materialising on the CPU and on a (simulated) GPU, the prefetcher one block ahead,
// a write that fails half way (the folder left as it was, the Loader fine afterwards), and
// hostile index.json files refused with what is wrong.
#include <signal.h>
#include <sys/resource.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/offload.h"
#include "loadstone/writer.h"
#include "loadstone/platform.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const std::string kFixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/offload";

std::map<std::string, uint32_t> ManifestCrcs() {
  std::ifstream in(kFixtures + "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::map<std::string, uint32_t> out;
  for (const auto& t : manifest["tensors"]) out[t["name"].get<std::string>()] = t["crc32"].get<uint32_t>();
  return out;
}

uint32_t Crc(const Tensor& t) {
  std::vector<std::byte> host(t.nbytes());
  REQUIRE(t.CopyToHost(host).ok());
  return static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(host.data()),
                                     static_cast<uInt>(host.size())));
}

// The fixture's .bin planned like `load --device-map auto --max-memory cpu=25000`.
LoadPlan PlanWithDisk(const Checkpoint& ckpt, const std::string& folder) {
  PlanOptions opt;
  opt.device_map = "auto";
  opt.max_memory = MaxMemory{{"cpu", int64_t{25000}}};
  opt.offload_folder = folder;
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  REQUIRE(plan->offloaded.size() == 7);
  return *plan;
}

// The fixture's .bin offloaded into a folder, with a Loader on one simulated GPU and the store.
struct Offloaded {
  Offloaded() {
    auto opened = Checkpoint::Open(kFixtures + "/model/pytorch_model.bin");
    REQUIRE(opened.ok());
    ckpt = *opened;
    plan = PlanWithDisk(*ckpt, dir.Path("off"));
    LoaderOptions lo;
    lo.platform = Platform::Simulated(SimulatedMachine::Gpus(1, 1ULL << 30).WithDevices());
    loader = std::make_shared<Loader>(lo);
    REQUIRE(WriteOffload(*loader, *ckpt, plan).ok());
    auto opened_store = OffloadStore::Open(loader, *ckpt, plan);
    REQUIRE(opened_store.ok());
    store = *opened_store;
  }
  TempDir dir;
  std::optional<Checkpoint> ckpt;
  LoadPlan plan;
  std::shared_ptr<Loader> loader;
  std::shared_ptr<OffloadStore> store;
};

}  // namespace

TEST_CASE("offload: the written folder reopens as a checkpoint with the same tensors", "[offload]") {
  TempDir dir;
  auto ckpt = Checkpoint::Open(kFixtures + "/model/pytorch_model.bin");
  REQUIRE(ckpt.ok());
  const LoadPlan plan = PlanWithDisk(*ckpt, dir.Path("off"));
  auto loader = std::make_shared<Loader>();
  auto written = WriteOffload(*loader, *ckpt, plan);
  REQUIRE(written.ok());
  CHECK(written->written == 7);
  CHECK(written->in_place == 0);
  CHECK(written->index_path == dir.Path("off") + "/index.json");

  auto folder = Checkpoint::Open(dir.Path("off"));
  REQUIRE(folder.ok());
  CHECK(folder->format() == CheckpointFormat::kOffloadFolder);
  CHECK(folder->tensors().size() == 7);
  const auto crcs = ManifestCrcs();
  auto all = Plan(*folder);
  REQUIRE(all.ok());
  LoadHandle load = loader->Load(*folder, *all);
  REQUIRE(load.Done().get().ok());
  for (const Tensor& t : load.Tensors()) {
    INFO(t.name());
    CHECK(Crc(t) == crcs.at(t.name()));
  }
  const TensorInfo* scalar = folder->Find("blocks.1.scale");
  REQUIRE(scalar != nullptr);
  CHECK(scalar->shape.empty());
  CHECK(scalar->nbytes == 4);
  CHECK(folder->Find("blocks.1.w")->dtype == DType::kBF16);
}

TEST_CASE("offload: tensors materialise on demand, on the CPU and on a GPU", "[offload]") {
  Offloaded off;
  auto& store = off.store;
  const TempDir& dir = off.dir;
  CHECK(store->names().size() == 7);
  CHECK_FALSE(store->Contains("blocks.0.w"));  // on the CPU, not offloaded
  const auto crcs = ManifestCrcs();
  for (const Device& device : {Device::Cpu(), Device::Cuda(0)}) {
    for (const std::string& name : store->names()) {
      INFO(name << " on " << device.ToString());
      const Tensor t = store->Materialize(name, device).get();
      CHECK(t.device() == device.ToString());
      CHECK(Crc(t) == crcs.at(name));
    }
  }
  auto where = store->Where("head.w");
  REQUIRE(where.ok());
  CHECK(*where == dir.Path("off") + "/head.w.dat");
  auto unknown = store->Materialize("blocks.0.w", Device::Cpu());
  REQUIRE_THROWS_AS(unknown.get(), Error);
}

TEST_CASE("offload: safetensors tensors are read in place, cast when they materialise", "[offload]") {
  auto ckpt = Checkpoint::Open(kFixtures + "/model/model.safetensors");
  REQUIRE(ckpt.ok());
  PlanOptions opt;
  opt.device_map = "auto";
  opt.max_memory = MaxMemory{{"cpu", int64_t{12000}}};  // f16 halves the model
  opt.dtype = DType::kF16;
  auto plan = Plan(*ckpt, opt);  // no folder needed
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->offloaded.empty());
  auto loader = std::make_shared<Loader>();
  auto written = WriteOffload(*loader, *ckpt, *plan);
  REQUIRE(written.ok());
  CHECK(written->written == 0);
  CHECK(written->index_path.empty());
  auto opened = OffloadStore::Open(loader, *ckpt, *plan);
  REQUIRE(opened.ok());
  const auto& store = *opened;
  const Tensor w = store->Materialize("head.w", Device::Cpu()).get();
  CHECK(w.dtype() == DType::kF16);  // planned f16; stored f32
  CHECK_THAT(*store->Where("head.w"), Catch::Contains("model.safetensors (in place, offset"));
  const Tensor ids = store->Materialize("blocks.1.ids", Device::Cpu()).get();
  CHECK(ids.dtype() == DType::kI64);  // integers never cast
}

TEST_CASE("offload: offload_in_place=false writes safetensors tensors as NAME.dat, as accelerate does",
          "[offload]") {
  auto ckpt = Checkpoint::Open(kFixtures + "/model/model.safetensors");
  REQUIRE(ckpt.ok());
  TempDir dir;
  PlanOptions opt;
  opt.device_map = "auto";
  opt.max_memory = MaxMemory{{"cpu", int64_t{12000}}};
  opt.offload_in_place = false;
  auto without_folder = Plan(*ckpt, opt);
  REQUIRE_FALSE(without_folder.ok());  // copies need a folder
  CHECK_THAT(std::string(without_folder.status().message()), Catch::Contains("offload_folder"));
  opt.offload_folder = dir.Path("off");
  auto plan = Plan(*ckpt, opt);
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->offloaded.empty());
  for (const OffloadPlan& o : plan->offloaded) CHECK_FALSE(o.in_place);
  auto loader = std::make_shared<Loader>();
  auto written = WriteOffload(*loader, *ckpt, *plan);
  REQUIRE(written.ok());
  CHECK(written->written == plan->offloaded.size());
  CHECK(written->in_place == 0);
  auto store = OffloadStore::Open(loader, *ckpt, *plan);
  REQUIRE(store.ok());
  const std::map<std::string, uint32_t> crcs = ManifestCrcs();
  for (const std::string& name : (*store)->names()) {
    CHECK_THAT(*(*store)->Where(name), Catch::EndsWith(name + ".dat"));
    CHECK(Crc((*store)->Materialize(name, Device::Cpu()).get()) == crcs.at(name));
  }
}

TEST_CASE("offload: the prefetcher streams the next block while the current one is used", "[offload]") {
  Offloaded off;
  OffloadPrefetcher prefetch(off.store, {{"blocks.1.w", "blocks.1.scale", "blocks.1.ids"},
                                         {"blocks.2.w", "blocks.2.mask"},
                                         {"head.w", "head.b"}},
                             Device::Cuda(0));
  const auto crcs = ManifestCrcs();
  for (size_t i = 0; i < prefetch.size(); ++i) {
    CHECK(prefetch.started(i) == (i > 0));  // block 0 starts with the first Get
    auto block = prefetch.Get(i);
    REQUIRE(block.ok());
    CHECK_FALSE(prefetch.started(i));        // taken
    CHECK(prefetch.started(i + 1) == (i + 1 < prefetch.size()));  // the next one is on its way
    for (const Tensor& t : *block) {
      CHECK(t.device() == "cuda:0");
      CHECK(Crc(t) == crcs.at(t.name()));
    }
  }
  CHECK(prefetch.Get(3).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("offload: a write that fails leaves the folder as it was and the Loader working", "[offload]") {
  TempDir dir;
  auto ckpt = Checkpoint::Open(kFixtures + "/model/pytorch_model.bin");
  REQUIRE(ckpt.ok());
  const LoadPlan plan = PlanWithDisk(*ckpt, dir.Path("off"));
  auto loader = std::make_shared<Loader>();
  // Files may not grow past 4 KiB: blocks.1.w.dat (8 KiB) fails with EFBIG, as a full disk would.
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  auto failed = WriteOffload(*loader, *ckpt, plan);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kIOError);
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("blocks.1.w.dat") && Catch::Contains("at offset"));
  CHECK(fs::is_empty(dir.Path("off")));  // no .dat left, no index.json
  // The same Loader writes the folder correctly afterwards.
  auto again = WriteOffload(*loader, *ckpt, plan);
  REQUIRE(again.ok());
  CHECK(again->written == 7);
  CHECK(Checkpoint::Open(dir.Path("off")).ok());
}

// The user's own files beside the ones written, named as a writer's scratch files might be, are
// neither truncated nor removed, whether the write fails or succeeds.
TEST_CASE("offload: files the write did not make are left as they were", "[offload]") {
  TempDir dir;
  auto ckpt = Checkpoint::Open(kFixtures + "/model/pytorch_model.bin");
  REQUIRE(ckpt.ok());
  const LoadPlan plan = PlanWithDisk(*ckpt, dir.Path("off"));
  fs::create_directories(dir.Path("off"));
  const std::vector<std::string> mine = {"blocks.1.w.dat.tmp", "blocks.1.ids.dat.tmp",
                                         ".blocks.1.w.dat", "notes.txt"};
  for (const std::string& name : mine) std::ofstream(dir.Path("off/" + name)) << "mine: " << name;
  auto unchanged = [&] {
    for (const std::string& name : mine) {
      INFO(name);
      std::ifstream in(dir.Path("off/" + name));
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      CHECK(text == "mine: " + name);
    }
  };
  Loader loader;
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;  // blocks.1.w.dat (8 KiB) fails, after others were written
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  auto failed = WriteOffload(loader, *ckpt, plan);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  REQUIRE_FALSE(failed.ok());
  unchanged();
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.Path("off"))) ++files;
  CHECK(files == mine.size());  // nothing of the failed write is left
  auto written = WriteOffload(loader, *ckpt, plan);
  REQUIRE(written.ok());
  CHECK(written->written == 7);
  unchanged();
  CHECK(Checkpoint::Open(dir.Path("off")).ok());
}

TEST_CASE("offload: a cancelled write (Ctrl-C) leaves the folder as it was", "[offload]") {
  TempDir dir;
  auto ckpt = Checkpoint::Open(kFixtures + "/model/pytorch_model.bin");
  REQUIRE(ckpt.ok());
  const LoadPlan plan = PlanWithDisk(*ckpt, dir.Path("off"));
  Loader loader;
  // Cancelled after the first batch: one tensor a batch, so some .dat files were written first.
  OffloadOptions options;
  options.batch_bytes = 1;
  int asked = 0;
  options.cancelled = [&] { return ++asked > 1; };
  auto cancelled = WriteOffload(loader, *ckpt, plan, options);
  REQUIRE_FALSE(cancelled.ok());
  CHECK(cancelled.status().code() == StatusCode::kCancelled);
  CHECK(asked > 1);
  CHECK(fs::is_empty(dir.Path("off")));  // the batches written before are removed, no index.json
  auto again = WriteOffload(loader, *ckpt, plan);
  REQUIRE(again.ok());
  CHECK(again->written == 7);
}

TEST_CASE("offload: a folder written for another plan is refused, not read as this one's", "[offload]") {
  Offloaded off;  // written for the stored dtypes
  PlanOptions opt;
  opt.explicit_map = off.plan.devices.device_map;  // the same tensors on disk, now as f16
  opt.dtype = DType::kF16;
  opt.offload_folder = off.dir.Path("off");
  auto f16 = Plan(*off.ckpt, opt);
  REQUIRE(f16.ok());
  auto stale = OffloadStore::Open(off.loader, *off.ckpt, *f16);
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.status().code() == StatusCode::kCorruption);
  CHECK_THAT(std::string(stale.status().message()), Catch::Contains("from another load"));
}

TEST_CASE("offload: in-place entries of any safetensors dtype reopen (float8 included)", "[offload]") {
  TempDir dir;
  std::vector<std::byte> f8(64, std::byte{0x38}), f32(16);
  REQUIRE(WriteSafetensors(dir.Path("m.safetensors"),
                           {{"a.w", DType::kF8E4M3, {8, 8}, f8, {}}, {"b.w", DType::kF32, {4}, f32, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(dir.Path("m.safetensors"));
  REQUIRE(ckpt.ok());
  PlanOptions opt;
  opt.explicit_map = *DeviceMap::FromJson(R"({"a": "disk", "b": "cpu"})");
  opt.offload_folder = dir.Path("off");
  auto plan = Plan(*ckpt, opt);
  REQUIRE(plan.ok());
  REQUIRE(plan->offloaded.size() == 1);
  auto loader = std::make_shared<Loader>();
  auto written = WriteOffload(*loader, *ckpt, *plan);
  REQUIRE(written.ok());
  CHECK(written->in_place == 1);
  std::ifstream index(dir.Path("off/index.json"));
  const std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("\"float8_e4m3fn\""));
  auto store = OffloadStore::Open(loader, *ckpt, *plan);
  REQUIRE(store.ok());
  const Tensor t = (*store)->Materialize("a.w", Device::Cpu()).get();
  CHECK(t.dtype() == DType::kF8E4M3);
  CHECK(*t.data() == std::byte{0x38});
}

TEST_CASE("offload: hostile index.json files are refused with what is wrong", "[offload]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([1, 2])", "is not a JSON object"},
      {R"({"../escape": {"dtype": "float32", "shape": [1]}})", "cannot name a file"},
      {R"({"a/b": {"dtype": "float32", "shape": [1]}})", "cannot name a file"},
      {R"({"w": {"dtype": "float8", "shape": [1]}})", "not a numpy dtype"},
      {R"({"w": {"dtype": "float32"}})", "neither a safetensors_file nor"},
      {R"({"w": {"dtype": "float32", "shape": [-1]}})", "a dimension that is"},
      {R"({"w": {"dtype": "float32", "shape": [4294967296, 4294967296]}})", "whole number of bytes"},
      // A product that wraps around 2^128 to 8 bits, were it not checked step by step.
      {R"({"w": {"dtype": "uint8", "shape": [18446744073709551615, 18446744073709551615, 3,
                                             12297829382473034411]}})", "whole number of bytes"},
      {R"({"w": {"dtype": "float32", "shape": [8]}})", "holds 4 bytes but index entry 'w'"},
      {R"({"w": {"safetensors_file": 3}})", "safetensors_file that is"},
      {R"({"w": 5})", "not an object"},
      {R"({"w": {"dtype": "float32", "shape": [1]}, "w": {"dtype": "float32", "shape": [1]}})", ""},
  };
  for (const auto& [index, message] : cases) {
    INFO(index);
    TempDir dir;
    dir.Write("index.json", index);
    dir.Write("w.dat", std::string(4, '\0'));
    auto opened = Checkpoint::Open(dir.path());
    REQUIRE_FALSE(opened.ok());
    CHECK(opened.status().code() == StatusCode::kCorruption);
    CHECK_THAT(std::string(opened.status().message()), Catch::Contains(message));
  }
  // A reference to a tensor its safetensors file lacks.
  TempDir dir;
  dir.Write("index.json", fmt::format(R"({{"x": {{"safetensors_file": "{}", "weight_name": "nope"}}}})",
                                      kFixtures + "/model/model.safetensors"));
  auto opened = Checkpoint::Open(dir.path());
  REQUIRE_FALSE(opened.ok());
  CHECK_THAT(std::string(opened.status().message()), Catch::Contains("names tensor 'nope'"));
}

}  // namespace loadstone
