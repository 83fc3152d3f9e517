// GPU placement through the device interface, on simulated devices (label `sim`): routing by
// the device map, conversions on the device, bounded staging, recycling under backpressure,
// cancellation and injected faults — what CI can test without a GPU.
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <random>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/loader.h"
#include "loadstone/writer.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/sim/sim_device.h"
#include "tests/runtime/pipeline/test_platform.h"
#include "test_model.h"
#include "testing/quantized_fixtures.h"

namespace loadstone {
namespace {

using device::SimDevice;
using device::SimDeviceOptions;
using testing::TempDir;

std::vector<std::shared_ptr<SimDevice>> MakeSims(int n, SimDeviceOptions base = {}) {
  std::vector<std::shared_ptr<SimDevice>> sims;
  for (int i = 0; i < n; ++i) {
    SimDeviceOptions o = base;
    o.name = "cuda:" + std::to_string(i);
    sims.push_back(std::make_shared<SimDevice>(o));
  }
  return sims;
}

device::DeviceSet AsSet(const std::vector<std::shared_ptr<SimDevice>>& sims) {
  return device::DeviceSet(sims.begin(), sims.end());
}

// `ckpt` planned with `po` onto "cuda:0" (one SimDevice with `latency`) and onto "cpu", both
// loaded by one Loader and finished OK.
struct GpuAndCpuLoads {
  GpuAndCpuLoads(const Checkpoint& ckpt, PlanOptions po, std::chrono::microseconds latency) {
    po.device_map = "cuda:0";
    auto on_gpu_plan = Plan(ckpt, po);
    po.device_map = "cpu";
    auto on_cpu_plan = Plan(ckpt, po);
    REQUIRE(on_gpu_plan.ok());
    REQUIRE(on_cpu_plan.ok());
    gpu_plan = std::move(*on_gpu_plan);
    sims = MakeSims(1, {.latency = latency});
    loader = std::make_unique<Loader>(testing::OnDevices(AsSet(sims)));
    on_gpu = loader->Load(ckpt, gpu_plan);
    on_cpu = loader->Load(ckpt, *on_cpu_plan);
    REQUIRE(on_gpu.Done().get().ok());
    REQUIRE(on_cpu.Done().get().ok());
  }
  LoadPlan gpu_plan;
  std::vector<std::shared_ptr<SimDevice>> sims;
  std::unique_ptr<Loader> loader;
  LoadHandle on_gpu, on_cpu;  // after `loader`: released first
};

TEST_CASE("sim: a sequential map over two GPUs and cpu puts every tensor where the map says") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "sequential";
  po.max_memory = MaxMemory{{"0", std::string("28MB")}, {"1", std::string("6MB")},
                            {"cpu", std::string("1GB")}};
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  auto sims = MakeSims(2, {.latency = std::chrono::microseconds(100)});
  Loader loader(testing::OnDevices(AsSet(sims)));
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  std::map<std::string, uint64_t> bytes;
  for (const Tensor& t : load.Tensors()) {
    INFO(t.name());
    CHECK(t.device() == plan->devices.device_map.Lookup(t.name())->ToString());
    bytes[t.device()] += t.nbytes();
    testing::CheckTensorBytes(t);
  }
  CHECK(bytes["cuda:0"] > 0);
  CHECK(bytes["cuda:1"] > 0);
  CHECK(bytes["cpu"] > 0);
  CHECK(bytes["cuda:0"] == sims[0]->allocated_bytes());
  CHECK(bytes["cuda:1"] == sims[1]->allocated_bytes());
  CHECK(sims[0]->jobs_done() > 0);
}

TEST_CASE("sim: conversions run on the device and match the CPU load") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions gpu;
  gpu.device_map = "cuda:0";
  gpu.dtype = DType::kF16;
  PlanOptions cpu = gpu;
  cpu.device_map = "cpu";
  auto gpu_plan = Plan(ckpt, gpu);
  auto cpu_plan = Plan(ckpt, cpu);
  REQUIRE(gpu_plan.ok());
  REQUIRE(cpu_plan.ok());
  auto sims = MakeSims(1);
  Loader loader(testing::OnDevices(AsSet(sims)));
  LoadHandle on_gpu = loader.Load(ckpt, *gpu_plan);
  LoadHandle on_cpu = loader.Load(ckpt, *cpu_plan);
  REQUIRE(on_gpu.Done().get().ok());
  REQUIRE(on_cpu.Done().get().ok());
  for (const TensorInfo& info : ckpt.tensors()) {
    const Tensor& g = on_gpu.Tensor(info.name).get();
    const Tensor& c = on_cpu.Tensor(info.name).get();
    INFO(info.name);
    CHECK(g.device() == "cuda:0");
    CHECK(g.dtype() == c.dtype());
    CHECK(testing::HostBytes(g) == testing::HostBytes(c));
  }
}

TEST_CASE("sim: float8 block dequant runs on the device with its scales, as on the CPU") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  PlanOptions po;
  po.dtype = DType::kBF16;
  po.max_chunk = 64 << 10;
  const GpuAndCpuLoads loads(m.ckpt, po, std::chrono::microseconds(300));
  REQUIRE(loads.sims[0]->CanDequantFp8Block(DType::kF8E4M3, DType::kBF16));
  int dequantized = 0;
  for (const TensorPlan& tp : loads.gpu_plan.tensors) {
    const std::string& name = m.ckpt.tensors()[tp.source].name;
    INFO(name);
    const Tensor& g = loads.on_gpu.Tensor(name).get();
    CHECK(g.device() == "cuda:0");
    CHECK(testing::HostBytes(g) == testing::HostBytes(loads.on_cpu.Tensor(name).get()));
    dequantized += tp.conversion == Conversion::kDequantFp8Block;
  }
  CHECK(dequantized == 4);
}

TEST_CASE("sim: compressed-tensors float8 with bf16 and f16 scales, on the device and the CPU") {
  // Per channel (bf16 scales) and per group of 64 (f16 scales): the scales' dtype reaches the
  // device job, and both placements give the CPU reference with the layout written out here.
  TempDir dir;
  const uint64_t rows = 96, cols = 256;
  std::vector<std::byte> codes(rows * cols), channel(rows * 2), group(rows * 4 * 2);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = testing::PatternByte(7, i);
  for (size_t i = 0; i < rows; ++i) {
    const uint16_t bf16 = static_cast<uint16_t>(0x3C00 + (i % 64));  // ~0.0078 .. 0.0117
    std::memcpy(&channel[i * 2], &bf16, 2);
  }
  for (size_t i = 0; i < rows * 4; ++i) {
    const uint16_t f16 = static_cast<uint16_t>(0x1C00 + (i % 512));  // ~0.0039 .. 0.0078
    std::memcpy(&group[i * 2], &f16, 2);
  }
  REQUIRE(WriteSafetensors(dir.Path("m.safetensors"),
                           {{"a.weight", DType::kF8E4M3, {rows, cols}, codes, {}},
                            {"a.weight_scale", DType::kBF16, {rows, 1}, channel, {}},
                            {"b.weight", DType::kF8E5M2, {rows, cols}, codes, {}},
                            {"b.weight_scale", DType::kF16, {rows, 4}, group, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(dir.Path("m.safetensors"));
  REQUIRE(ckpt.ok());
  PlanOptions po;
  po.dtype = DType::kF32;
  po.max_chunk = 16 << 10;  // pieces that start mid-row and mid-group
  const GpuAndCpuLoads loads(*ckpt, po, std::chrono::microseconds(200));
  const struct {
    const char* name;
    DType from;
    const std::vector<std::byte>& scales;
    convert::Fp8BlockScales layout;
  } weights[] = {{"a.weight", DType::kF8E4M3, channel, {nullptr, cols, 1, cols, 1, DType::kBF16}},
                 {"b.weight", DType::kF8E5M2, group, {nullptr, cols, 1, 64, 4, DType::kF16}}};
  for (const auto& w : weights) {
    INFO(w.name);
    convert::Fp8BlockScales layout = w.layout;
    layout.scales = w.scales.data();
    std::vector<std::byte> want(rows * cols * 4);
    REQUIRE(convert::DequantFp8Block(w.from, DType::kF32, codes.data(), want.data(), 0,
                                     rows * cols, layout)
                .ok());
    const Tensor g = loads.on_gpu.Tensor(w.name).get();
    CHECK(g.device() == "cuda:0");
    CHECK(g.dtype() == DType::kF32);
    CHECK(testing::HostBytes(g) == want);
    CHECK(testing::HostBytes(loads.on_cpu.Tensor(w.name).get()) == want);
  }
  CHECK(testing::HostBytes(loads.on_gpu.Tensor("a.weight_scale").get()) == channel);  // as stored
}

TEST_CASE("sim: the trace shows each device's copy and compute streams, job by job") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:0";
  po.dtype = DType::kBF16;
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.ok());
  auto sims = MakeSims(1, {.latency = std::chrono::microseconds(200)});
  Loader loader(testing::OnDevices(AsSet(sims)));
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(m.ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  const auto doc = nlohmann::json::parse(testing::TraceText(load, dir));
  std::map<uint64_t, std::string> tracks;  // tid → name, from the metadata events
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M") tracks[e["tid"].get<uint64_t>()] = e["args"]["name"].get<std::string>();
  }
  std::map<std::string, int> spans;  // "track|name prefix" → count
  std::set<std::string> dequant_track;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] != "device" || !tracks.count(e["tid"].get<uint64_t>())) continue;
    const std::string track = tracks[e["tid"].get<uint64_t>()];
    const std::string name = e["name"].get<std::string>();
    CHECK(e["dur"].get<double>() >= 0);
    const std::string tensor = e["args"]["tensor"].get<std::string>();
    CHECK(m.ckpt.Find(tensor) != nullptr);
    ++spans[track + "|" + name.substr(0, name.find(' '))];
    if (name.starts_with("fp8-block-dequant")) dequant_track.insert(tensor);
  }
  // One copy per device job; a kernel only for the converted tensors: the float8 weight
  // without scales (a cast) and the four with scales (dequants). The bf16 tensors (already the
  // target) and the scales (kept as stored) are copied only.
  CHECK(spans["cuda:0 copy|h2d"] == static_cast<int>(sims[0]->jobs_done()));
  CHECK(spans["cuda:0 compute|cast"] == 1);
  CHECK(spans["cuda:0 compute|fp8-block-dequant"] == 4);
  CHECK(dequant_track.size() == 4);
  CHECK(spans.size() == 3);
}

// The spans named `kernel...` on cuda:0's compute track of trace `text`.
size_t KernelSpans(const std::string& text, const std::string& kernel) {
  const auto doc = nlohmann::json::parse(text);
  std::map<uint64_t, std::string> tracks;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M") tracks[e["tid"].get<uint64_t>()] = e["args"]["name"].get<std::string>();
  }
  size_t kernels = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && tracks[e["tid"].get<uint64_t>()] == "cuda:0 compute" &&
        e["name"].get<std::string>().starts_with(kernel)) {
      ++kernels;
    }
  }
  return kernels;
}

// Quantized weights go to the device packed and the device decodes them (Device::
// DecodesQuantized; the simulated one with the CPU references and the quant state it was sent),
// bit for bit the producers' values: bitsandbytes 4-bit (nested absmax tables) and LLM.int8,
// compressed-tensors, GPTQ with activation order (zeros and g_idx tables), AWQ, GGUF blocks.
TEST_CASE("sim: quantized weights are decoded on the device from their packed bytes") {
  // A device without the kernels: the workers decode, the device copies (no kernel span).
  const bool on_device = GENERATE(true, false);
  INFO((on_device ? "the device decodes" : "the workers decode"));
  for (const testing::QuantFixture& fixture : testing::QuantFixtures()) {
    INFO(fixture.path);
    TempDir dir;
    auto ckpt = Checkpoint::Open(testing::FixturePath(fixture.path));
    REQUIRE(ckpt.ok());
    PlanOptions po;
    po.device_map = "cuda:0";
    po.dtype = DType::kF32;
    auto plan = Plan(*ckpt, po);
    REQUIRE(plan.ok());
    auto sims = MakeSims(1, {.decodes_quantized = on_device});
    Loader loader(testing::OnDevices(AsSet(sims)));
    LoadOptions options;
    options.trace = true;
    LoadHandle load = loader.Load(*ckpt, *plan, options);
    const Status done = load.Done().get();
    INFO(done.ToString());
    REQUIRE(done.ok());
    const size_t decoded = testing::CheckDecoded(fixture, *ckpt, *plan, load, "f32");
    CHECK(decoded > 0);
    // A kernel span per decoded piece on the device's compute track; none when the workers
    // decode (the device then copies the decoded values).
    const size_t kernels = KernelSpans(testing::TraceText(load, dir), fixture.kernel);
    if (on_device) CHECK(kernels >= decoded);
    if (!on_device) CHECK(kernels == 0);
    // The plan sent them to the device's decode (a GPU it knew nothing of decodes); a device
    // without the kernels is the one departure, counted and named.
    size_t quantized = 0;
    for (const TensorPlan& tp : plan->tensors) {
      if (!Unpacks(tp.conversion)) continue;
      ++quantized;
      CHECK(tp.conversion_site == ConversionSite::kDevice);
    }
    CHECK(load.read_stats().conversions_moved == (on_device ? 0 : quantized));
    CHECK((load.backend().find("cuda:0 has no kernels for quantized weights") ==
           std::string::npos) == on_device);
  }
}

// A plan made for GPUs without the kernels (PlatformGpu::decodes_quantized false) has the
// workers decode, even on a device that could: the executor runs each conversion where the plan
// says, nothing moved.
TEST_CASE("sim: a quantized weight's conversion runs where the plan says") {
  const testing::QuantFixture& fixture = testing::QuantFixtures().front();
  auto ckpt = Checkpoint::Open(testing::FixturePath(fixture.path));
  REQUIRE(ckpt.ok());
  SimulatedMachine machine = SimulatedMachine::Gpus(1, 1ULL << 30);
  machine.decodes_quantized = false;
  PlanOptions po;
  po.device_map = "cuda:0";
  po.dtype = DType::kF32;
  po.platform = Platform::Simulated(machine);
  auto plan = Plan(*ckpt, po);
  REQUIRE(plan.ok());
  size_t quantized = 0;
  for (const TensorPlan& tp : plan->tensors) {
    if (!Unpacks(tp.conversion)) continue;
    ++quantized;
    CHECK(tp.conversion_site == ConversionSite::kCpuThenDevice);
  }
  REQUIRE(quantized > 0);
  auto sims = MakeSims(1, {.decodes_quantized = true});
  Loader loader(testing::OnDevices(AsSet(sims)));
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(*ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  CHECK(testing::CheckDecoded(fixture, *ckpt, *plan, load, "f32") == quantized);
  CHECK(load.read_stats().conversions_moved == 0);
  TempDir dir;
  CHECK(KernelSpans(testing::TraceText(load, dir), fixture.kernel) == 0);
  CHECK(sims[0]->jobs_done() > 0);  // the device copied the decoded values
}

TEST_CASE("sim: staging stays bounded and slots are recycled under backpressure") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:0";
  po.max_chunk = 1 << 20;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  REQUIRE(plan->reads.size() > 20);
  // A slow device: reads outrun it, so staging fills and must wait for recycled slots.
  auto sims = MakeSims(1, {.bandwidth_bytes_per_s = 2e9});
  LoaderOptions lo;
  lo.staging_bytes = 3 << 20;  // three 1 MiB slots (+ a page each)
  Loader loader(testing::OnDevices(AsSet(sims), lo));
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
  const uint64_t slot = (1 << 20) + 4096;
  CHECK(sims[0]->staging_bytes() <= 3 * slot);
  size_t pieces = 1;  // device jobs per staged read (coalesced small tensors give several)
  for (const ReadChunk& r : plan->reads) pieces = std::max(pieces, r.tensors.size());
  CHECK(sims[0]->max_queued() <= 3 * pieces);
  CHECK(sims[0]->jobs_done() >= plan->reads.size());
}

TEST_CASE("sim: cancel with device jobs in flight, device memory is given back") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:0";
  po.max_chunk = 1 << 20;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  auto sims = MakeSims(1, {.latency = std::chrono::microseconds(500)});
  Loader loader(testing::OnDevices(AsSet(sims)));
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 8; ++round) {
    {
      LoadHandle load = loader.Load(ckpt, *plan);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 8000));
      load.Cancel();
      const Status s = load.Done().get();
      CHECK((s.ok() || s.code() == StatusCode::kCancelled));
      if (!s.ok()) CHECK(load.Tensors().empty());
    }
    sims[0]->Drain();
    CHECK(sims[0]->allocated_bytes() == 0);  // every tensor handle is gone: memory is back
  }
  LoadHandle again = loader.Load(ckpt, *plan);
  REQUIRE(again.Done().get().ok());
}

TEST_CASE("sim: a failing device job fails the load naming tensor and device") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:0";
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  auto sims = MakeSims(1, {.fail_job = 3});
  Loader loader(testing::OnDevices(AsSet(sims)));
  {
    LoadHandle load = loader.Load(ckpt, *plan);
    const Status s = load.Done().get();
    INFO(s.ToString());
    REQUIRE(s.code() == StatusCode::kIOError);
    CHECK_THAT(std::string(s.message()), Catch::Contains("on cuda:0"));
    CHECK_THAT(std::string(s.message()), Catch::Contains("placing tensor '"));
    CHECK(load.Tensors().empty());
  }
  sims[0]->Drain();
  CHECK(sims[0]->allocated_bytes() == 0);
}

TEST_CASE("sim: out of device memory, and a GPU the Loader does not have") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:0";
  auto plan = Plan(ckpt, po);
  auto sims = MakeSims(1, {.memory_bytes = 4 << 20});
  Loader loader(testing::OnDevices(AsSet(sims)));
  LoadHandle oom = loader.Load(ckpt, *plan);
  const Status s = oom.Done().get();
  REQUIRE(s.code() == StatusCode::kOutOfMemory);
  CHECK_THAT(std::string(s.message()), Catch::Contains("cuda:0"));
  PlanOptions far;
  far.device_map = "cuda:3";
  auto far_plan = Plan(ckpt, far);
  LoadHandle missing = loader.Load(ckpt, *far_plan);
  const Status m = missing.Done().get();
  REQUIRE(m.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(m.message()), Catch::Contains("1 GPU(s)"));
}

}  // namespace
}  // namespace loadstone
