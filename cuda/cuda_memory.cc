// Free and total memory of every CUDA device (cuda_device.h).
#include <cuda_runtime.h>

#include <vector>

#include "cuda/cuda_device.h"
#include "cuda/cuda_handles.h"

namespace loadstone::cuda {

std::vector<CudaMemory> CudaMemoryPerDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  std::vector<CudaMemory> memory;
  for (int i = 0; i < count; ++i) {
    DeviceGuard guard(i);
    size_t free = 0, total = 0;
    if (!guard.status().ok() || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      free = total = 0;
    }
    memory.push_back({free, total});
  }
  return memory;
}

std::vector<uint64_t> CudaFreeBytesPerDevice() {
  std::vector<uint64_t> free;
  for (const CudaMemory& m : CudaMemoryPerDevice()) free.push_back(m.free);
  return free;
}

}  // namespace loadstone::cuda
