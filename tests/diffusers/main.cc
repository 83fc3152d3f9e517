// The diffusers suite's main: with LOADSTONE_DIFFUSERS_GPU=1 (the `diffusers_gpu` CTest entry,
// label `gpu`) the tests run on this machine's real GPUs, so it skips (exit 77, CTest's
// SKIP_RETURN_CODE) with its reason where LibTorch has no CUDA or the machine has no GPU.
#include <cstdlib>
#include <iostream>

#include <torch/cuda.h>

#include "loadstone/platform.h"

#undef CHECK  // glog's; Catch's below
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  if (std::getenv("LOADSTONE_DIFFUSERS_GPU") != nullptr) {
    if (!torch::cuda::is_available()) {
      std::cout << "skipped: this LibTorch has no CUDA (Debian's libtorch-dev is CPU-only); build "
                   "against a CUDA LibTorch to run the diffusers suite on real GPUs\n";
      return 77;
    }
    if (loadstone::Platform::Default()->Gpus().empty()) {
      std::cout << "skipped: loadstone finds no GPU here ("
                << loadstone::Platform::Default()->description() << ")\n";
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
