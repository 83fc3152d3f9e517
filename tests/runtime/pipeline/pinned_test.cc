// PlanOptions::pin_cpu_tensors: CPU tensors in the GPU's pinned host memory, warm and cold, with
// every byte right and every block given back; a driver that will not pin fails the load naming
// the tensor; a Loader with no GPU refuses; a simulated GPU says its memory is ordinary.
#include <map>
#include <mutex>

#include <catch2/catch.hpp>

#include "loadstone/loader.h"
#include "runtime/sim/sim_device.h"
#include "tests/runtime/pipeline/test_model.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {

using testing::TempDir;

// A GPU whose staging "pins" (or refuses to): a simulated device for everything else, and a
// record of the staging blocks it has handed out and not yet got back.
class PinningDevice final : public device::Accelerator {
 public:
  explicit PinningDevice(bool pins) : pins_(pins), sim_(device::SimDeviceOptions{}) {}

  device::DeviceInfo Info() const override {
    device::DeviceInfo info = sim_.Info();
    info.description = "a test GPU that pins";  // not "simulated": its staging is "pinned"
    return info;
  }
  Result<device::DeviceMemory> Allocate(uint64_t bytes) override { return sim_.Allocate(bytes); }
  Result<device::HostStaging> AllocateStaging(uint64_t bytes) override {
    device::HostStaging staging;
    staging.bytes = bytes;
    if (!pins_) {
      staging.data = std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
      staging.why_pageable = "pinning failed: cudaHostRegister: cudaErrorMemoryAllocation (a test)";
      return staging;
    }
    auto* block = new std::byte[bytes];
    {
      std::lock_guard lock(mu_);
      live_[block] = bytes;
    }
    staging.data = std::shared_ptr<std::byte>(block, [this](std::byte* p) {
      {
        std::lock_guard lock(mu_);
        live_.erase(p);
      }
      delete[] p;
    });
    staging.pinned = true;
    return staging;
  }
  bool CanConvert(DType from, DType to) const override { return sim_.CanConvert(from, to); }
  bool CanDequantFp8Block(DType from, DType to) const override {
    return sim_.CanDequantFp8Block(from, to);
  }
  void Submit(device::PlaceJob job) override { sim_.Submit(std::move(job)); }
  Status CopyToHost(const std::byte* src, uint64_t bytes, std::byte* dst) override {
    return sim_.CopyToHost(src, bytes, dst);
  }
  void Drain() override { sim_.Drain(); }

  // Whether [data, data + bytes) lies inside one live staging block.
  bool InsideStaging(const std::byte* data, uint64_t bytes) const {
    std::lock_guard lock(mu_);
    auto it = live_.upper_bound(data);
    if (it == live_.begin()) return false;
    --it;
    return data >= it->first && data + bytes <= it->first + it->second;
  }
  size_t live_blocks() const {
    std::lock_guard lock(mu_);
    return live_.size();
  }

 private:
  const bool pins_;
  device::SimDevice sim_;
  mutable std::mutex mu_;
  std::map<const std::byte*, uint64_t> live_;  // guarded by mu_
};

PlanOptions Pinning() {
  PlanOptions opt;
  opt.pin_cpu_tensors = true;
  return opt;
}

// The mixed test checkpoint, planned with pinning.
struct PinnedModel : testing::MixedModel {
  LoadPlan pinned = PlanOf(ckpt, Pinning());
};

}  // namespace

TEST_CASE("pinned: the plan pins CPU tensors only, never as fresh pages, shared or mapped",
          "[pipeline]") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions opt = Pinning();
  opt.routes.mmap = GENERATE(false, true);
  const std::string chosen = ckpt.tensors().front().name;
  opt.caller_memory = [&](const TensorInfo& t) { return t.name == chosen; };
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) {
    const TensorPlan& tp = plan->tensors[t];
    const bool caller = ckpt.tensors()[tp.source].name == chosen;
    CHECK(tp.pinned == !caller);  // the caller's memory is the caller's
    CHECK(tp.caller_memory == caller);
    CHECK_FALSE(tp.fresh_pages);
  }
  for (const ReadChunk& r : plan->reads) {
    CHECK_FALSE(r.shared_buffer);
    CHECK(r.route != ReadRoute::kMapped);
    CHECK(r.route != ReadRoute::kFreshPages);
  }
}

TEST_CASE("pinned: CPU tensors land in the GPU's pinned staging, warm and cold, all given back",
          "[pipeline]") {
  PinnedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan* plan = &model.pinned;
  auto gpu = std::make_shared<PinningDevice>(/*pins=*/true);
  {
    Loader loader(testing::OnDevices({gpu}));
    for (const bool cold : {false, true}) {
      INFO((cold ? "cold" : "warm"));
      if (cold) {
        for (const CheckpointFile& f : ckpt.files()) REQUIRE(testing::DropFromPageCache(f.path));
      }
      LoadHandle load = loader.Load(ckpt, *plan);
      REQUIRE(load.Done().get().ok());
      CHECK_THAT(load.backend(), Catch::Contains("CPU tensors in pinned host memory of cuda:0"));
      REQUIRE(load.Tensors().size() == ckpt.tensors().size());
      for (const Tensor& t : load.Tensors()) {
        INFO(t.name());
        CHECK(t.device() == "cpu");
        CHECK(gpu->InsideStaging(t.data(), t.nbytes()));
        testing::CheckTensorBytes(t);
      }
      // Warm, pinned memory (which exists before the load) is filled by the workers' copy.
      if (!cold) CHECK(load.read_stats().taken(ReadRoute::kPageCacheCopy).bytes > 0);
    }
  }
  CHECK(gpu->live_blocks() == 0);  // every pinned block freed with its tensors
}

TEST_CASE("pinned: a driver that will not pin fails the load naming the tensor, and no GPU refuses",
          "[pipeline]") {
  PinnedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan* plan = &model.pinned;
  {
    Loader loader(testing::OnDevices({std::make_shared<PinningDevice>(/*pins=*/false)}));
    const Status s = loader.Load(ckpt, *plan).Done().get();
    CHECK(s.code() == StatusCode::kOutOfMemory);
    CHECK_THAT(std::string(s.message()), Catch::Contains("could not pin it") &&
                                             Catch::Contains("cudaErrorMemoryAllocation") &&
                                             Catch::Contains("tensor '"));
    // Usable again: the same plan without pinning loads.
    auto unpinned = Plan(ckpt);
    REQUIRE(unpinned.ok());
    REQUIRE(loader.Load(ckpt, *unpinned).Done().get().ok());
  }
  Loader cpu_only(testing::OnDevices({}));
  const Status none = cpu_only.Load(ckpt, *plan).Done().get();
  CHECK(none.code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(none.message()), Catch::Contains("no GPU to pin it for"));
}

TEST_CASE("pinned: on a simulated GPU the memory is ordinary, and the backend says so",
          "[pipeline][sim]") {
  PinnedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan* plan = &model.pinned;
  auto sim = std::make_shared<device::SimDevice>(device::SimDeviceOptions{});
  Loader loader(testing::OnDevices({sim}));
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  CHECK_THAT(load.backend(), Catch::Contains("cuda:0 is simulated, they are ordinary host memory"));
  uint64_t bytes = 0;
  for (const Tensor& t : load.Tensors()) {
    testing::CheckTensorBytes(t);
    bytes += t.nbytes();
  }
  CHECK(sim->staging_bytes() >= bytes);  // from the device's staging, not loadstone's own
}

TEST_CASE("pinned: a hand-edited plan that pins a fresh-pages tensor is refused", "[pipeline]") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  auto fresh = std::find_if(plan->tensors.begin(), plan->tensors.end(),
                            [](const TensorPlan& t) { return t.fresh_pages; });
  if (fresh == plan->tensors.end()) {
    WARN("no fresh-pages tensor planned here; skipped");
    return;
  }
  fresh->pinned = true;
  Loader loader(testing::OnDevices({std::make_shared<PinningDevice>(true)}));
  const Status s = loader.Load(ckpt, *plan).Done().get();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("in pinned memory, but also in fresh pages"));
}

}  // namespace loadstone
