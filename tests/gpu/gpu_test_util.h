// GPU tests skip cleanly, with the reason, where there is no CUDA device.
#ifndef LOADSTONE_TESTS_GPU_GPU_TEST_UTIL_H_
#define LOADSTONE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <catch2/catch.hpp>

#include "cuda/probe.h"

#define LOADSTONE_SKIP_WITHOUT_GPU()                                           \
  do {                                                                         \
    const auto loadstone_probe_ = ::loadstone::cuda::ProbeCuda();              \
    if (loadstone_probe_.device_count == 0) {                                  \
      WARN("skipped: no CUDA device (" << loadstone_probe_.reason << ")");     \
      return;                                                                  \
    }                                                                          \
  } while (0)

#endif  // LOADSTONE_TESTS_GPU_GPU_TEST_UTIL_H_
