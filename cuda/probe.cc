#include "cuda/probe.h"

#include <cuda_runtime.h>

namespace loadstone::cuda {

CudaProbeResult ProbeCuda() {
  CudaProbeResult result;
  cudaRuntimeGetVersion(&result.runtime_version);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    result.reason = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so that later calls start clean
    return result;
  }
  result.device_count = count;
  if (count == 0) result.reason = "no CUDA device";
  return result;
}

}  // namespace loadstone::cuda
