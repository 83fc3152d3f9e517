// GPU tests skip cleanly (with the reason) where there is no device.
#include "cuda/probe.h"

#include <catch2/catch.hpp>

TEST_CASE("cuda probe: reports devices or says why there are none") {
  const auto probe = loadstone::cuda::ProbeCuda();
  CHECK(probe.runtime_version > 0);
  if (probe.device_count == 0) {
    CHECK_FALSE(probe.reason.empty());
    WARN("skipped: no CUDA device (" << probe.reason << ")");
    return;
  }
  CHECK(probe.reason.empty());
}
