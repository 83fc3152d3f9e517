// Planning and loading for a machine given as a value: a simulated two-GPU platform gets a map
// that uses both GPUs with no max_memory, and a Loader on it puts every byte where the plan says.
#include <set>

#include <catch2/catch.hpp>

#include "loadstone/loader.h"
#include "loadstone/platform.h"
#include "loadstone/platform.h"
#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

TEST_CASE("platform: the default is probed once, a simulated one says what it is") {
  CHECK(Platform::Default() == Platform::Default());
  CHECK_FALSE(Platform::Default()->simulated());
  CHECK_FALSE(Platform::Default()->description().empty());
  CHECK(Platform::Default()->page_size() >= 4096);
  const auto two = Platform::Simulated(SimulatedMachine::Gpus(2, 600ULL << 20));
  CHECK(two->simulated());
  CHECK(two->description() == "simulated: 2 GPU(s) of 600 MiB, 600 MiB");
  const auto gpus = two->Gpus();
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[1].name == "cuda:1");
  CHECK(gpus[1].free_bytes == 600ULL << 20);
  const auto host = Platform::Simulated({{}, 12345})->AvailableHostBytes();
  REQUIRE(host.ok());
  CHECK(*host == 12345u);
}

// A Llama-like checkpoint of equal layers with known bytes, in two shards.
Checkpoint EqualLayers(const TempDir& dir) {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 10; ++i) {
    data.emplace_back(512 * 1024);
    for (size_t k = 0; k < data.back().size(); ++k) data.back()[k] = testing::PatternByte(i, k);
  }
  tensors.push_back({"model.embed_tokens.weight", DType::kBF16, {512, 512}, data[0], {}});
  for (int i = 0; i < 8; ++i) {
    tensors.push_back({"model.layers." + std::to_string(i) + ".mlp.weight", DType::kBF16, {512, 512},
                       data[i + 1], {}});
  }
  tensors.push_back({"lm_head.weight", DType::kBF16, {512, 512}, data[9], {}});
  return testing::WriteAndOpen(dir, tensors, 3'000'000);
}

TEST_CASE("platform: auto with no max_memory uses both GPUs of a simulated machine, and loads there") {
  TempDir dir;
  Checkpoint ckpt = EqualLayers(dir);
  PlanOptions po;
  po.device_map = "auto";
  po.platform = Platform::Simulated(SimulatedMachine::Gpus(2, 2 * ckpt.total_bytes()));
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  std::set<std::string> devices;
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) devices.insert(plan->device_of(t).ToString());
  CHECK(devices == std::set<std::string>{"cuda:0", "cuda:1"});
  // The same options on this machine (no GPU here, or real ones) never invent a simulated one.
  PlanOptions here = po;
  here.platform = nullptr;
  auto local = Plan(ckpt, here);
  REQUIRE(local.ok());
  CHECK(local->devices.usage.size() == Platform::Default()->Gpus().size() + 1);

  // Platform::Simulated is for planning: the production library has no device behind its GPUs.
  LoaderOptions planning_only;
  planning_only.platform = po.platform;
  const Status refused = Loader(planning_only).Load(ckpt, *plan).Done().get();
  REQUIRE(refused.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("planning only"));
  CHECK_THAT(std::string(refused.message()), Catch::Contains("SimulatedMachine::devices"));

  // The same machine with simulated devices behind it (runtime/sim/, test and tool support).
  LoaderOptions lo;
  lo.platform = Platform::Simulated(SimulatedMachine::Gpus(2, 2 * ckpt.total_bytes()).WithDevices());
  Loader loader(lo);
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  std::map<std::string, uint64_t> bytes;
  for (const Tensor& t : load.Tensors()) {
    INFO(t.name());
    const TensorInfo* src = ckpt.Find(t.name());
    REQUIRE(src != nullptr);
    const uint64_t seed = t.name() == "model.embed_tokens.weight" ? 0
                          : t.name() == "lm_head.weight"        ? 9
                                                                : std::stoi(t.name().substr(13)) + 1;
    std::vector<std::byte> expected(src->nbytes);
    for (size_t k = 0; k < expected.size(); ++k) expected[k] = testing::PatternByte(seed, k);
    CHECK(testing::HostBytes(t) == expected);  // copied back from its simulated device
    bytes[t.device()] += t.nbytes();
  }
  CHECK(bytes["cuda:0"] > 0);
  CHECK(bytes["cuda:1"] > 0);
  CHECK(bytes["cuda:0"] + bytes["cuda:1"] == ckpt.total_bytes());
}

TEST_CASE("platform: a plan for more GPUs than the Loader's machine has is refused at load") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.device_map = "cuda:1";
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  LoaderOptions lo;
  lo.platform = Platform::Simulated(SimulatedMachine::Gpus(1, 1ULL << 30).WithDevices());
  Loader loader(lo);
  const Status s = loader.Load(ckpt, *plan).Done().get();
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("this machine has 1 GPU(s), cuda:0 to cuda:0") != std::string_view::npos);
}

}  // namespace
}  // namespace loadstone
