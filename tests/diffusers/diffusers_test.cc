// diffusers' ModelTesterMixin loading tests, in C++: save_pretrained / from_pretrained round
// trips, variants, dtypes, keep_in_fp32, sharded checkpoints, device_map="auto" with cpu and
// disk offload, model parallelism and the device-map errors — for a UNet, a VAE and a
// transformer shaped like diffusers' test models (models.h). Devices 0 and 1 are simulated
// (host memory behind the device interface): the planning, placement and loading are the real
// ones; the forward passes run on the CPU over the loaded memory.
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/torch.h"
#include "loadstone/writer.h"
#include "loadstone/platform.h"
#include "tests/diffusers/models.h"
#include "tests/testing/temp_dir.h"

// LibTorch's logging (glog) defines CHECK; the tests mean Catch's.
#undef CHECK
#include <catch2/catch.hpp>

namespace loadstone::testing::diffusers {
namespace {

namespace fs = std::filesystem;
using libtorch::DeviceMapArg;
using libtorch::LoadInto;
using libtorch::LoadReport;
using libtorch::SaveOptions;
using libtorch::SavePretrained;
using libtorch::TorchLoadOptions;

// A temporary folder (tests/testing/temp_dir.h) with the path as a member, as the tests use it.
struct TempDir {
  testing::TempDir dir;
  const std::string path = dir.path();
};

// A fresh model, its parameters re-drawn from `seed` (so a load that does nothing shows).
template <typename M>
M Fresh(uint64_t seed) {
  torch::manual_seed(seed);
  M model;
  model->eval();
  return model;
}

// The model's outputs, computed on the CPU: a model whose parameters sit on several real devices
// (the `gpu` run) is copied into a CPU twin first — these models have no hooks that move
// activations between devices, and the values, not the devices, are what is compared here
// (CheckDeviceMapIsRespected checks the devices).
template <typename M>
torch::Tensor Run(M& model) {
  torch::NoGradGuard no_grad;
  bool on_cpu = true;
  for (const auto& t : model->parameters()) on_cpu = on_cpu && t.device().is_cpu();
  for (const auto& t : model->buffers()) on_cpu = on_cpu && t.device().is_cpu();
  if (on_cpu) return model->forward(M::Impl::MakeInputs());
  M twin;
  twin->eval();
  auto from = model->named_parameters();
  for (auto& p : twin->named_parameters()) p.value().set_data(from[p.key()].to(at::kCPU));
  auto buffers = model->named_buffers();
  for (auto& b : twin->named_buffers()) b.value().set_data(buffers[b.key()].to(at::kCPU));
  return twin->forward(M::Impl::MakeInputs());
}

// LOADSTONE_DIFFUSERS_GPU=1 (the `diffusers_gpu` CTest entry, label `gpu`): devices 0 and 1 are
// this machine's real GPUs instead of simulated ones (main.cc skips where there are none).
bool RealGpus() { return std::getenv("LOADSTONE_DIFFUSERS_GPU") != nullptr; }

// compute_module_sizes(model)[""]: every parameter and buffer.
uint64_t ModelSize(const torch::nn::Module& m) {
  uint64_t n = 0;
  for (const auto& p : m.parameters()) n += p.nbytes();
  for (const auto& b : m.buffers()) n += b.nbytes();
  return n;
}

// `count` simulated GPUs of 1 GiB; in the `gpu` run this machine (null when it has fewer than
// `count` GPUs: the test then says it is skipped). No GPUs at all is always simulated.
std::shared_ptr<const Platform> SimGpus(int count) {
  if (RealGpus() && count > 0) {
    auto here = Platform::Default();
    if (static_cast<int>(here->Gpus().size()) >= count) return here;
    WARN("skipped: needs " << count << " GPUs, this machine has " << here->Gpus().size());
    return nullptr;
  }
  return Platform::Simulated(SimulatedMachine{std::vector<uint64_t>(count, 1ULL << 30), 16ULL << 30}.WithDevices());
}

std::set<std::string> MapValues(const DeviceMap& map) {
  std::set<std::string> out;
  for (const auto& e : map.entries()) out.insert(e.device.ToJsonValue());
  return out;
}

// diffusers' check_device_map_is_respected: every parameter is where the map's longest prefix
// entry says.
template <typename M>
void CheckDeviceMapIsRespected(M& model, const libtorch::Placement& placement) {
  for (const auto& p : model->named_parameters()) {
    const std::optional<Device> want = placement.device_map.Lookup(p.key());
    INFO(p.key());
    REQUIRE(want.has_value());
    REQUIRE(placement.device_of.count(p.key()) == 1);
    CHECK(placement.device_of.at(p.key()) == want->ToString());
    if (want->type == Device::Type::kDisk) CHECK(p.value().numel() == 0);
    // On real GPUs the parameter is there; simulated, GPU tensors are host memory.
    if (!placement.simulated && want->is_gpu()) {
      CHECK(p.value().device() == c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(want->index)));
    } else if (want->type == Device::Type::kCpu) {
      CHECK(p.value().device().is_cpu());
    }
  }
}

bool AllClose(const torch::Tensor& a, const torch::Tensor& b, double atol) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, /*rtol=*/0, atol);
}

template <typename T>
std::string StatusText(const T& r) {
  if constexpr (std::is_same_v<T, Status>) return r.ToString();
  else return r.status().ToString();
}
// Requires an OK Result or Status, printing the error otherwise.
#define REQUIRE_OK(expr)              \
  do {                                \
    const auto& ok_ = (expr);         \
    INFO(StatusText(ok_));            \
    REQUIRE(ok_.ok());                \
  } while (0)

// The reloaded model carries the loaded values, and a state dict equal to the saved one.
template <typename M>
void CheckSameState(M& a, M& b) {
  const auto sa = libtorch::PersistentStateDict(*a), sb = libtorch::PersistentStateDict(*b);
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(torch::equal(sa[i].second.to(sb[i].second.dtype()), sb[i].second));
  }
}

void CheckClean(const LoadReport& report) {
  CHECK(report.missing_keys.empty());
  CHECK(report.unexpected_keys.empty());
  CHECK(report.mismatched_keys.empty());
}

// Loads `path` with `opt` into a fresh model (other seed): no missing, unexpected or mismatched
// key, and its outputs within `atol` of `base`. Returns the model and the report.
template <typename M>
std::pair<M, LoadReport> ReloadAndCompare(const std::string& path, const TorchLoadOptions& opt,
                                          const torch::Tensor& base, double atol) {
  auto loaded = Fresh<M>(2);
  auto report = LoadInto(*loaded, path, opt);
  REQUIRE_OK(report);
  CheckClean(*report);
  CHECK(AllClose(Run(loaded), base, atol));
  return {loaded, *std::move(report)};
}

// Saves `model`, loads it with device_map="auto" under `max_memory` on `gpus` simulated GPUs:
// the map's values are exactly `values` (accelerate's JSON spelling), every parameter is where
// the map says, and the outputs match within 1e-5.
template <typename M>
void CheckAutoMap(M& model, const MaxMemory& max_memory, int gpus, const std::set<std::string>& values) {
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.max_memory = max_memory;
  opt.platform = SimGpus(gpus);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  auto [loaded, report] = ReloadAndCompare<M>(dir.path, opt, base, 1e-5);
  CHECK(MapValues(report.placement.device_map) == values);
  CheckDeviceMapIsRespected(loaded, report.placement);
}

}  // namespace

#define MODELS UNet2DConditionModel, AutoencoderKL, DiTTransformer2DModel

TEMPLATE_TEST_CASE("from_save_pretrained", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  CHECK(fs::exists(fs::path(dir.path) / "diffusion_pytorch_model.safetensors"));
  auto loaded = Fresh<TestType>(2);
  CHECK_FALSE(AllClose(Run(loaded), base, 5e-5));  // a fresh model differs
  auto report = LoadInto(*loaded, dir.path);
  REQUIRE_OK(report);
  CheckClean(*report);
  CHECK(AllClose(Run(loaded), base, 5e-5));
  CheckSameState(model, loaded);
  CHECK(report->placement.device_map.ToJson() == R"({"": "cpu"})");
}

TEMPLATE_TEST_CASE("from_save_pretrained_variant", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path, SaveOptions{.variant = "fp16"}));
  CHECK(fs::exists(fs::path(dir.path) / "diffusion_pytorch_model.fp16.safetensors"));
  auto loaded = Fresh<TestType>(2);
  // Without the variant there are no weights to load (diffusers raises an OSError).
  auto missing = LoadInto(*loaded, dir.path);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  TorchLoadOptions opt;
  opt.open.variant = "fp16";
  ReloadAndCompare<TestType>(dir.path, opt, base, 5e-5);
}

TEMPLATE_TEST_CASE("from_save_pretrained_dtype", "[diffusers]", MODELS) {
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    auto model = Fresh<TestType>(1);
    model->to(dtype);
    TempDir dir;
    REQUIRE_OK(SavePretrained(*model, dir.path));
    // torch_dtype given: every floating tensor becomes it; integer buffers stay as they are.
    auto loaded = Fresh<TestType>(2);
    TorchLoadOptions opt;
    opt.dtype = dtype;
    REQUIRE_OK(LoadInto(*loaded, dir.path, opt));
    for (const auto& [name, t] : libtorch::PersistentStateDict(*loaded)) {
      INFO(name);
      if (t.is_floating_point()) CHECK(t.scalar_type() == dtype);
      else CHECK(t.scalar_type() == at::kLong);
    }
    CheckSameState(model, loaded);
    // No torch_dtype: each tensor takes its parameter's dtype (the fresh model's float32).
    auto as_param = Fresh<TestType>(3);
    REQUIRE_OK(LoadInto(*as_param, dir.path));
    for (const auto& p : as_param->parameters()) CHECK(p.scalar_type() == at::kFloat);
  }
}

TEMPLATE_TEST_CASE("keep_in_fp32_modules", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    auto loaded = Fresh<TestType>(2);
    TorchLoadOptions opt;
    opt.dtype = dtype;
    opt.keep_in_fp32_modules = {"conv_out", "proj_out", "norm2"};
    REQUIRE_OK(LoadInto(*loaded, dir.path, opt));
    size_t kept = 0;
    for (const auto& p : loaded->named_parameters()) {
      std::string name = p.key();
      const bool keep = ("." + name + ".").find(".conv_out.") != std::string::npos ||
                        ("." + name + ".").find(".proj_out.") != std::string::npos ||
                        ("." + name + ".").find(".norm2.") != std::string::npos;
      INFO(name);
      CHECK(p.value().scalar_type() == (keep ? at::kFloat : dtype));
      kept += keep;
    }
    CHECK(kept > 0);
  }
}

TEMPLATE_TEST_CASE("sharded_checkpoints", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  const uint64_t size = ModelSize(*model);
  TempDir dir;
  auto files = SavePretrained(*model, dir.path, SaveOptions{.max_shard_size = size * 3 / 4});
  REQUIRE(files.ok());
  const fs::path index = fs::path(dir.path) / "diffusion_pytorch_model.safetensors.index.json";
  REQUIRE(fs::exists(index));
  std::ifstream in(index);
  const auto doc = nlohmann::json::parse(in);
  std::set<std::string> unique;
  for (const auto& [k, v] : doc["weight_map"].items()) unique.insert(std::string(v));
  size_t shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) shards += e.path().extension() == ".safetensors";
  CHECK(shards == unique.size());
  CHECK(shards >= 2);
  ReloadAndCompare<TestType>(dir.path, {}, base, 1e-5);
}

TEMPLATE_TEST_CASE("sharded_checkpoints_with_variant", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path,
                            SaveOptions{.variant = "fp16", .max_shard_size = ModelSize(*model) * 3 / 4}));
  CHECK(fs::exists(fs::path(dir.path) / "diffusion_pytorch_model.safetensors.index.fp16.json"));
  TorchLoadOptions opt;
  opt.open.variant = "fp16";
  ReloadAndCompare<TestType>(dir.path, opt, base, 1e-5);
}

TEMPLATE_TEST_CASE("sharded_checkpoints_device_map", "[diffusers][sim]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path, SaveOptions{.max_shard_size = ModelSize(*model) * 3 / 4}));
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.platform = SimGpus(1);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  auto [loaded, report] = ReloadAndCompare<TestType>(dir.path, opt, base, 1e-5);
  CHECK(MapValues(report.placement.device_map) == std::set<std::string>{"0"});
  CheckDeviceMapIsRespected(loaded, report.placement);
}

TEMPLATE_TEST_CASE("cpu_offload", "[diffusers][sim]", MODELS) {
  auto model = Fresh<TestType>(1);
  const uint64_t size = ModelSize(*model);
  for (const double percent : {0.5, 0.7}) {
    INFO(percent);
    CheckAutoMap(model, MaxMemory{{"0", static_cast<int64_t>(percent * size)},
                                  {"cpu", static_cast<int64_t>(size * 2)}},
                 1, {"0", "\"cpu\""});
  }
}

TEST_CASE("cpu_offload with pinned memory: the cpu part pinned on request, refused without a GPU",
          "[diffusers][sim]") {
  auto model = Fresh<UNet2DConditionModel>(1);
  const auto base = Run(model);
  const uint64_t size = ModelSize(*model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.max_memory = MaxMemory{{"0", static_cast<int64_t>(size / 2)}, {"cpu", static_cast<int64_t>(size * 2)}};
  opt.pin_memory = true;
  opt.platform = SimGpus(1);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  auto [loaded, report] = ReloadAndCompare<UNet2DConditionModel>(dir.path, opt, base, 1e-5);
  CHECK(MapValues(report.placement.device_map) == std::set<std::string>{"0", "\"cpu\""});
  CheckDeviceMapIsRespected(loaded, report.placement);
  // A machine without a GPU has nothing to pin for: an error, not pageable memory said to be pinned.
  TorchLoadOptions cpu_only;
  cpu_only.pin_memory = true;
  cpu_only.platform = SimGpus(0);
  auto refused = LoadInto(*Fresh<UNet2DConditionModel>(2), dir.path, cpu_only);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("no GPU to pin it for"));
}

TEMPLATE_TEST_CASE("disk_offload_without_safetensors", "[diffusers][sim]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  const uint64_t size = ModelSize(*model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path, SaveOptions{.safe_serialization = false}));
  CHECK(fs::exists(fs::path(dir.path) / "diffusion_pytorch_model.bin"));
  const uint64_t max_size = size / 2;
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.max_memory = MaxMemory{{"0", static_cast<int64_t>(max_size)}, {"cpu", static_cast<int64_t>(max_size / 10)}};
  opt.platform = SimGpus(1);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  {
    auto loaded = Fresh<TestType>(2);
    auto refused = LoadInto(*loaded, dir.path, opt);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()),
               Catch::Contains("The current `device_map` had weights offloaded to the disk. Please "
                               "provide an `offload_folder` for them."));
  }
  opt.offload_folder = dir.path;  // diffusers' test offloads into the model folder itself
  auto loaded = Fresh<TestType>(2);
  auto report = LoadInto(*loaded, dir.path, opt);
  REQUIRE_OK(report);
  CheckClean(*report);
  CHECK(MapValues(report->placement.device_map).count("\"disk\"") == 1);
  CheckDeviceMapIsRespected(loaded, report->placement);
  REQUIRE(report->placement.offloaded);
  CHECK(fs::exists(fs::path(dir.path) / "index.json"));
  for (const std::string& name : report->placement.offloaded->names()) {
    CHECK(fs::exists(fs::path(dir.path) / (name + ".dat")));
  }
  REQUIRE_OK(libtorch::MaterializeOffloaded(*loaded, report->placement, Device::Cuda(0)));
  CHECK(AllClose(Run(loaded), base, 1e-5));
}

TEMPLATE_TEST_CASE("disk_offload_with_safetensors", "[diffusers][sim]", MODELS) {
  auto model = Fresh<TestType>(1);
  const auto base = Run(model);
  const uint64_t size = ModelSize(*model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  const uint64_t max_size = size / 2;
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.max_memory = MaxMemory{{"0", static_cast<int64_t>(max_size)}, {"cpu", static_cast<int64_t>(max_size / 10)}};
  opt.platform = SimGpus(1);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  auto loaded = Fresh<TestType>(2);
  auto report = LoadInto(*loaded, dir.path, opt);  // no folder needed: read in place
  REQUIRE_OK(report);
  CheckClean(*report);
  CHECK(MapValues(report->placement.device_map).count("\"disk\"") == 1);
  CheckDeviceMapIsRespected(loaded, report->placement);
  CHECK_FALSE(fs::exists(fs::path(dir.path) / "index.json"));  // nothing copied
  const auto& store = report->placement.offloaded;
  REQUIRE(store);
  auto where = store->Where(store->names().front());
  REQUIRE(where.ok());
  CHECK_THAT(*where, Catch::Contains("diffusion_pytorch_model.safetensors (in place"));
  REQUIRE_OK(libtorch::MaterializeOffloaded(*loaded, report->placement, Device::Cpu()));
  CHECK(AllClose(Run(loaded), base, 1e-5));
}

TEMPLATE_TEST_CASE("model_parallelism", "[diffusers][sim]", MODELS) {
  auto model = Fresh<TestType>(1);
  const uint64_t size = ModelSize(*model);
  for (const double percent : {0.7, 0.9}) {
    INFO(percent);
    CheckAutoMap(model, MaxMemory{{"0", static_cast<int64_t>(percent * size)},
                                  {"1", static_cast<int64_t>(size * 2)},
                                  {"cpu", static_cast<int64_t>(size * 2)}},
                 2, {"0", "1"});
  }
}

TEMPLATE_TEST_CASE("sharded_keep_in_fp32_across_shards", "[diffusers]", MODELS) {
  auto model = Fresh<TestType>(1);
  TempDir dir;
  // Small shards: the norm2 tensors (one per block) land in several files.
  REQUIRE_OK(SavePretrained(*model, dir.path, SaveOptions{.max_shard_size = ModelSize(*model) / 6}));
  std::ifstream in(fs::path(dir.path) / "diffusion_pytorch_model.safetensors.index.json");
  const auto doc = nlohmann::json::parse(in);
  std::set<std::string> shards_with_kept;
  for (const auto& [k, v] : doc["weight_map"].items()) {
    if (("." + k + ".").find(".norm2.") != std::string::npos) shards_with_kept.insert(std::string(v));
  }
  REQUIRE(shards_with_kept.size() >= 2);
  auto loaded = Fresh<TestType>(2);
  TorchLoadOptions opt;
  opt.dtype = at::kHalf;
  opt.keep_in_fp32_modules = {"norm2"};
  REQUIRE_OK(LoadInto(*loaded, dir.path, opt));
  for (const auto& p : loaded->named_parameters()) {
    INFO(p.key());
    const bool keep = ("." + p.key() + ".").find(".norm2.") != std::string::npos;
    CHECK(p.value().scalar_type() == (keep ? at::kFloat : at::kHalf));
  }
  CheckSameState(model, loaded);
}

TEST_CASE("wrong_device_map_raises_error", "[diffusers]") {
  auto model = Fresh<DiTTransformer2DModel>(1);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  const std::vector<std::pair<DeviceMapArg, std::string>> cases = {
      {DeviceMapArg::Index(-1), "You can't pass device_map as a negative int"},
      {DeviceMapArg::Name("foo"), "When passing device_map as a string, the value needs to be a device name"},
      {DeviceMapArg::Name("disk"), "When passing device_map as a string, the value needs to be a device name"},
  };
  for (const auto& [arg, message] : cases) {
    auto loaded = Fresh<DiTTransformer2DModel>(2);
    TorchLoadOptions opt;
    opt.device_map = arg;
    auto r = LoadInto(*loaded, dir.path, opt);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains(message));
  }
}

TEST_CASE("device_map normalisation follows diffusers", "[diffusers]") {
  using libtorch::NormalizeDeviceMap;
  auto json = [](const DeviceMapArg& arg) {
    auto n = NormalizeDeviceMap(arg);
    REQUIRE(n.ok());
    return n->map ? n->map->ToJson() : "mode " + n->mode;
  };
  CHECK(json(DeviceMapArg::Index(0)) == R"({"": 0})");
  CHECK(json(DeviceMapArg::Index(1)) == R"({"": 1})");
  CHECK(json(DeviceMapArg::Name("cpu")) == R"({"": "cpu"})");
  CHECK(json(DeviceMapArg::Name("cuda")) == R"({"": 0})");
  CHECK(json(DeviceMapArg::Name("cuda:1")) == R"({"": 1})");
  CHECK(json(DeviceMapArg::TorchDevice(c10::Device("cuda:2"))) == R"({"": 2})");
  CHECK(json(DeviceMapArg::TorchDevice(c10::Device(c10::kCPU))) == R"({"": "cpu"})");
  CHECK(json(DeviceMapArg{}) == R"({"": "cpu"})");
  for (const char* mode : {"auto", "balanced", "balanced_low_0", "sequential"}) {
    CHECK(json(DeviceMapArg::Name(mode)) == std::string("mode ") + mode);
  }
  auto dict = DeviceMap::FromJson(R"({"a": 0, "b": "cpu"})");
  REQUIRE(dict.ok());
  CHECK(json(DeviceMapArg::Map(*dict)) == R"({"a": 0, "b": "cpu"})");
  CHECK_FALSE(NormalizeDeviceMap(DeviceMapArg::Name("1")).ok());  // torch.device("1") refuses
}

TEST_CASE("a model without _no_split_modules refuses a string device map", "[diffusers]") {
  auto model = Fresh<UndeclaredModel>(1);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  for (const char* mode : {"auto", "balanced", "sequential"}) {
    TorchLoadOptions opt;
    opt.device_map = DeviceMapArg::Name(mode);
    auto r = LoadInto(*model, dir.path, opt);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message() ==
          fmt::format("UndeclaredModel does not support `device_map='{}'`. To implement support, "
                      "the model class needs to implement the `_no_split_modules` attribute.",
                      mode));
  }
  // A device, not a mode, needs no no-split declaration.
  TorchLoadOptions opt;
  opt.device_map = DeviceMapArg::Name("cpu");
  CHECK(LoadInto(*model, dir.path, opt).ok());
}

TEST_CASE("missing, unexpected and mismatched keys are reported like diffusers", "[diffusers]") {
  auto model = Fresh<DiTTransformer2DModel>(1);
  TempDir dir;
  // A checkpoint of another shape: proj_out wider, one key renamed, one extra.
  auto state = libtorch::PersistentStateDict(*model);
  std::vector<TensorToWrite> tensors;
  std::vector<torch::Tensor> keep;
  for (auto& [name, t] : state) {
    std::string n = name == "norm_out.bias" ? "norm_out.shift" : name;
    torch::Tensor c = name == "proj_out.weight" ? torch::zeros({17, 32}) : t.contiguous();
    keep.push_back(c);
    auto dtype = libtorch::FromScalarType(c.scalar_type());
    REQUIRE(dtype.ok());
    TensorToWrite w{n, *dtype, {}, {static_cast<const std::byte*>(c.data_ptr()), c.nbytes()}, {}};
    for (auto d : c.sizes()) w.shape.push_back(d);
    tensors.push_back(std::move(w));
  }
  const std::string file = dir.path + "/diffusion_pytorch_model.safetensors";
  REQUIRE(WriteSafetensors(file, tensors).ok());

  auto loaded = Fresh<DiTTransformer2DModel>(2);
  auto refused = LoadInto(*loaded, dir.path);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("because proj_out.weight expected shape torch.Size([16, 32]), but got "
                             "torch.Size([17, 32])"));
  TorchLoadOptions opt;
  opt.ignore_mismatched_sizes = true;
  auto report = LoadInto(*loaded, dir.path, opt);
  REQUIRE_OK(report);
  CHECK(report->missing_keys == std::vector<std::string>{"norm_out.bias"});
  CHECK(report->unexpected_keys == std::vector<std::string>{"norm_out.shift"});
  REQUIRE(report->mismatched_keys.size() == 1);
  CHECK(report->mismatched_keys[0].name == "proj_out.weight");
  CHECK(report->mismatched_keys[0].found == std::vector<int64_t>{17, 32});
  // The non-persistent buffer is neither loaded nor missing.
  for (const auto& k : report->missing_keys) CHECK(k != "pos_embed.pos_embed");
  opt.strict = true;
  auto strict = LoadInto(*loaded, dir.path, opt);
  REQUIRE_FALSE(strict.ok());
  CHECK_THAT(std::string(strict.status().message()),
             Catch::Contains("Missing key(s) in state_dict: \"norm_out.bias\"") &&
                 Catch::Contains("Unexpected key(s) in state_dict: \"norm_out.shift\""));
}

// Two Linear layers shaped as the bitsandbytes fixture's sharded checkpoint
// (tests/fixtures/make_bnb_fixtures.py): an nf4 weight with nested absmax and an fp4 one, each
// with its quant state in the other shard.
struct BnbShardedModelImpl : torch::nn::Module {
  BnbShardedModelImpl()
      : nested(register_module("nested", torch::nn::Linear(torch::nn::LinearOptions(515, 66).bias(false)))),
        fp4(register_module("fp4", torch::nn::Linear(torch::nn::LinearOptions(40, 8).bias(false)))) {}
  torch::nn::Linear nested, fp4;
};
TORCH_MODULE(BnbShardedModel);

TEST_CASE("sharded_quantized_checkpoint: bitsandbytes shards load into a dequantized model unmerged",
          "[diffusers]") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/bnb";
  auto expected = libtorch::LoadStateDict(fixtures + "/expected.safetensors");
  REQUIRE_OK(expected);
  struct Case {
    std::optional<c10::ScalarType> torch_dtype;
    std::vector<std::string> keep_in_fp32;
    const char* nested_as;
    const char* fp4_as;
  };
  for (const Case& c : {Case{std::nullopt, {}, "f32", "f32"},  // each to its parameter's dtype
                        Case{at::kBFloat16, {}, "bf16", "bf16"},
                        Case{at::kHalf, {"nested"}, "f32", "f16"}}) {
    INFO(c.nested_as << " / " << c.fp4_as);
    torch::manual_seed(3);
    BnbShardedModel model;
    TorchLoadOptions opt;
    opt.dtype = c.torch_dtype;
    opt.keep_in_fp32_modules = c.keep_in_fp32;
    opt.strict = true;  // the quant-state tensors are part of their weights, not unexpected
    auto report = LoadInto(*model, fixtures + "/sharded", opt);
    REQUIRE_OK(report);
    CHECK(report->missing_keys.empty());
    CHECK(report->unexpected_keys.empty());
    const torch::Tensor want_nested = expected->at(std::string("nested.weight.") + c.nested_as);
    const torch::Tensor want_fp4 = expected->at(std::string("fp4.weight.") + c.fp4_as);
    REQUIRE(model->nested->weight.scalar_type() == want_nested.scalar_type());
    REQUIRE(model->fp4->weight.scalar_type() == want_fp4.scalar_type());
    CHECK(torch::equal(model->nested->weight, want_nested));
    CHECK(torch::equal(model->fp4->weight, want_fp4));
  }
}

// Linear layers shaped as the compressed-tensors fixture (tests/fixtures/make_ct_fixtures.py).
struct PackQuantizedModelImpl : torch::nn::Module {
  PackQuantizedModelImpl() {
    for (const auto& [name, out, in] : kLayers) {
      register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    }
  }
  struct Layer {
    const char* name;
    int64_t out, in;
  };
  static constexpr Layer kLayers[] = {{"sym4_group", 16, 256},   {"asym4_group", 196, 128},
                                      {"sym8_channel", 8, 96},   {"asym8_channel", 10, 64},
                                      {"sym2_group", 6, 100},    {"gidx4", 16, 128}};
};
TORCH_MODULE(PackQuantizedModel);

TEST_CASE("pack_quantized_checkpoint: M.weight_packed loads into M.weight, dequantized",
          "[diffusers]") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/ct";
  auto expected = libtorch::LoadStateDict(fixtures + "/expected.safetensors");
  REQUIRE_OK(expected);
  PackQuantizedModel model;
  TorchLoadOptions opt;
  opt.dtype = at::kBFloat16;
  opt.strict = true;  // weight_packed is the model's weight; scales, shapes, zero points its state
  auto report = LoadInto(*model, fixtures + "/pack.safetensors", opt);
  REQUIRE_OK(report);
  CHECK(report->missing_keys.empty());
  CHECK(report->unexpected_keys.empty());
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    INFO(name);
    const torch::Tensor want = expected->at(name + ".bf16");
    REQUIRE(want.defined());
    CHECK(p.scalar_type() == at::kBFloat16);
    CHECK(torch::equal(p, want));
  }
  // Into the parameters' own memory (the weight-swap case), by their decoded names.
  PackQuantizedModel swapped;
  opt.copy_into_parameters = true;
  REQUIRE_OK(LoadInto(*swapped, fixtures + "/pack.safetensors", opt));
  CHECK(torch::equal(swapped->named_parameters()["gidx4.weight"], expected->at("gidx4.weight.bf16")));
  opt.copy_into_parameters = false;
  auto sd = libtorch::LoadStateDict(fixtures + "/pack.safetensors", opt);  // the decoded names
  REQUIRE_OK(sd);
  CHECK(sd->at("gidx4.weight").defined());
  CHECK_FALSE(sd->at("gidx4.weight_packed").defined());
}

// GPTQ and AWQ checkpoints (tests/fixtures/make_gptq_fixtures.py): one Linear `layer` each.
TEST_CASE("gptq_awq_checkpoint: M.qweight loads into M.weight, dequantized", "[diffusers]") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gptq";
  auto expected = libtorch::LoadStateDict(fixtures + "/expected.safetensors");
  REQUIRE_OK(expected);
  for (const std::string c : {"gptq4_desc_act", "gptq3_g32", "gptq4_v2", "awq4_g32"}) {
    INFO(c);
    const torch::Tensor want = expected->at(c + ".weight.f32");
    struct Model : torch::nn::Module {
      Model(int64_t in, int64_t out) {
        layer = register_module("layer",
                                torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
      }
      torch::nn::Linear layer{nullptr};
    } model(want.size(1), want.size(0));
    TorchLoadOptions opt;
    opt.dtype = at::kFloat;
    opt.strict = true;  // qweight is the model's weight; scales, qzeros, g_idx its quant state
    auto report = LoadInto(model, fixtures + "/" + c, opt);
    REQUIRE_OK(report);
    CHECK(report->missing_keys.empty());
    CHECK(report->unexpected_keys.empty());
    CHECK(model.layer->weight.scalar_type() == at::kFloat);
    CHECK(torch::equal(model.layer->weight, want));
  }
}

// compressed-tensors float-quantized weights (make_ct_fixtures.py): float8 with scales beside
// them, dequantized into the model's parameters, the scales part of their weight.
TEST_CASE("float8_checkpoint: scaled float8 weights load into float parameters, dequantized",
          "[diffusers]") {
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/ct";
  auto expected = libtorch::LoadStateDict(fixtures + "/float_expected.safetensors");
  REQUIRE_OK(expected);
  struct Model : torch::nn::Module {
    Model() {
      for (const auto& [name, out, in] :
           {std::tuple{"f8_tensor", 32, 256}, {"f8_channel", 32, 256}, {"f8_group", 32, 256},
            {"f8_block", 128, 256}}) {
        register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
      }
    }
  } model;
  TorchLoadOptions opt;
  opt.dtype = at::kFloat;
  opt.strict = true;  // the weight_scale tensors belong to their weights
  auto report = LoadInto(model, fixtures + "/float.safetensors", opt);
  REQUIRE_OK(report);
  CHECK(report->unexpected_keys.empty());
  CHECK(report->missing_keys.empty());
  for (const auto& item : model.named_parameters()) {
    INFO(item.key());
    CHECK(torch::equal(item.value(), expected->at(item.key() + ".f32")));
  }
}

TEST_CASE("LoadStateDict hands over loadstone's memory", "[diffusers]") {
  auto model = Fresh<AutoencoderKL>(1);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  torch::Tensor kept;
  {
    auto sd = libtorch::LoadStateDict(dir.path);
    REQUIRE(sd.ok());
    CHECK(sd->tensors.size() == libtorch::PersistentStateDict(*model).size());
    kept = sd->at("encoder.conv_in.weight");
    REQUIRE(kept.defined());
  }
  // The state dict and its load are gone; the tensor's deleter keeps its buffer alive.
  CHECK(torch::equal(kept, model->encoder->conv_in->weight));
  TorchLoadOptions opt;
  opt.dtype = at::kBFloat16;
  auto bf16 = libtorch::LoadStateDict(dir.path, opt);
  REQUIRE(bf16.ok());
  CHECK(bf16->at("decoder.conv_out.bias").scalar_type() == at::kBFloat16);
}

TEST_CASE("copy_into_parameters fills the existing memory", "[diffusers]") {
  auto model = Fresh<DiTTransformer2DModel>(1);
  const auto base = Run(model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  auto loaded = Fresh<DiTTransformer2DModel>(2);
  std::vector<const void*> before;
  for (const auto& p : loaded->parameters()) before.push_back(p.data_ptr());
  TorchLoadOptions opt;
  opt.copy_into_parameters = true;
  REQUIRE_OK(LoadInto(*loaded, dir.path, opt));
  size_t i = 0;
  for (const auto& p : loaded->parameters()) CHECK(p.data_ptr() == before[i++]);
  CHECK(AllClose(Run(loaded), base, 1e-5));
}

TEST_CASE("copy_into_parameters with a device map: GPU tensors are copied, host ones read in place",
          "[diffusers][sim]") {
  auto model = Fresh<DiTTransformer2DModel>(1);
  const auto base = Run(model);
  const uint64_t size = ModelSize(*model);
  TempDir dir;
  REQUIRE_OK(SavePretrained(*model, dir.path));
  auto loaded = Fresh<DiTTransformer2DModel>(2);
  TorchLoadOptions opt;
  opt.copy_into_parameters = true;
  opt.device_map = DeviceMapArg::Name("auto");
  opt.max_memory = MaxMemory{{"0", static_cast<int64_t>(size / 2)}, {"cpu", static_cast<int64_t>(size * 2)}};
  opt.platform = SimGpus(1);
  if (!opt.platform) return;  // too few real GPUs (SimGpus)
  auto report = LoadInto(*loaded, dir.path, opt);
  REQUIRE_OK(report);
  CHECK(MapValues(report->placement.device_map) == std::set<std::string>{"0", "\"cpu\""});
  CHECK(AllClose(Run(loaded), base, 1e-5));  // every parameter filled, wherever it was planned
}

TEST_CASE("DescribeModule gives the model description with classes and buffers", "[diffusers]") {
  auto model = Fresh<DiTTransformer2DModel>(1);
  auto json = libtorch::DescribeModuleJson(*model);
  REQUIRE(json.ok());
  const auto doc = nlohmann::json::parse(*json);
  CHECK(doc["modules"]["class"] == "DiTTransformer2DModel");
  const auto& blocks = doc["modules"]["children"][2];
  CHECK(blocks["name"] == "transformer_blocks");
  CHECK(blocks["children"][0]["class"] == "BasicTransformerBlock");
  const auto& buffers = doc["modules"]["children"][0]["buffers"];
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0]["name"] == "position_ids");
  CHECK(buffers[0]["dtype"] == "int64");
  CHECK(buffers[0]["persistent"] == true);
  CHECK(buffers[1]["persistent"] == false);
  auto description = libtorch::DescribeModule(*model);
  REQUIRE(description.ok());
  // Tied parameters are found by shared storage.
  torch::NoGradGuard no_grad;
  model->transformer_blocks[1]->as<BasicTransformerBlock>()->norm1->weight.set_data(
      model->transformer_blocks[0]->as<BasicTransformerBlock>()->norm1->weight.data());
  auto tied = libtorch::DescribeModuleJson(*model);
  REQUIRE(tied.ok());
  CHECK(nlohmann::json::parse(*tied)["tied"] ==
        nlohmann::json::parse(R"([["transformer_blocks.0.norm1.weight", "transformer_blocks.1.norm1.weight"]])"));
}

}  // namespace loadstone::testing::diffusers
