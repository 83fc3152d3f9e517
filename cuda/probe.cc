#include "cuda/probe.h"

#include <unistd.h>

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace loadstone::cuda {

CudaProbeResult ProbeCuda() {
  CudaProbeResult result;
  cudaRuntimeGetVersion(&result.runtime_version);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // cudaErrorInsufficientDriver also means "no driver at all": tell the two apart, so that a
    // machine without a GPU does not read as one whose driver wants an upgrade.
    const bool driver_loaded = ::access("/proc/driver/nvidia/version", F_OK) == 0;
    if (err == cudaErrorNoDevice || (err == cudaErrorInsufficientDriver && !driver_loaded)) {
      result.reason = "no NVIDIA driver is loaded on this machine";
    } else if (err == cudaErrorInsufficientDriver) {
      result.reason = fmt::format(
          "the NVIDIA driver is older than this CUDA runtime ({}.{}) needs ({})",
          result.runtime_version / 1000, result.runtime_version % 1000 / 10,
          cudaGetErrorString(err));
    } else {
      result.reason = cudaGetErrorString(err);
    }
    cudaGetLastError();  // clear the sticky error so that later calls start clean
    return result;
  }
  result.device_count = count;
  if (count == 0) result.reason = "the driver reports no GPU";
  return result;
}

}  // namespace loadstone::cuda
