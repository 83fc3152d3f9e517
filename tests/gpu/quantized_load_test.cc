// The producers' quantized fixtures loaded onto this machine's GPU (cuda:0) through the whole
// pipeline — packed bytes copied, decoded by the CUDA kernels with the quant state the load
// copied there — against the producers' values, bit for bit, into f32, bf16 and f16. Skips
// without a CUDA device.
#include <catch2/catch.hpp>

#include "gpu_test_util.h"
#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "testing/quantized_fixtures.h"

namespace loadstone {
namespace {

TEST_CASE("gpu: quantized checkpoints load onto cuda:0 decoded as their producers decode",
          "[gpu]") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  for (const auto& [dtype, suffix] :
       {std::pair{DType::kF32, "f32"}, {DType::kBF16, "bf16"}, {DType::kF16, "f16"}}) {
    for (const testing::QuantFixture& fixture : testing::QuantFixtures()) {
      INFO(fixture.path << " into " << suffix);
      auto ckpt = Checkpoint::Open(testing::FixturePath(fixture.path));
      REQUIRE(ckpt.ok());
      PlanOptions po;
      po.device_map = "cuda:0";
      po.dtype = dtype;
      auto plan = Plan(*ckpt, po);
      INFO(plan.status().ToString());
      REQUIRE(plan.ok());
      Loader loader;
      LoadHandle load = loader.Load(*ckpt, *plan);
      const Status done = load.Done().get();
      INFO(done.ToString() << "\nbackend: " << load.backend());
      REQUIRE(done.ok());
      CHECK(testing::CheckDecoded(fixture, *ckpt, *plan, load, suffix) > 0);
    }
  }
}

}  // namespace
}  // namespace loadstone
