// ProbeGpus with the CUDA backend: the GPUs the CUDA runtime sees, their free memory, and one
// CudaDevice each for a Loader. No CUDA header here: cuda/'s CUDA-free headers only.
#include <string>

#include <fmt/format.h>

#include "cuda/cuda_device.h"
#include "cuda/probe.h"
#include "runtime/device/platform_impl.h"

namespace loadstone::device {

void ProbeGpus(Platform::Impl* impl) {
  const cuda::CudaProbeResult probe = cuda::ProbeCuda();
  if (probe.device_count == 0) {
    impl->description = "CPU only: no CUDA device: " + probe.reason;
    impl->gpus = [] { return std::vector<PlatformGpu>{}; };
    impl->open_devices = [description = impl->description](std::string* log) {
      if (log) *log = description;
      return DeviceSet{};
    };
    return;
  }
  impl->description = fmt::format("CUDA: {} GPU(s)", probe.device_count);
  impl->gpus = [] {
    std::vector<PlatformGpu> gpus;
    const std::vector<cuda::CudaMemory> memory = cuda::CudaMemoryPerDevice();
    for (size_t i = 0; i < memory.size(); ++i) {
      gpus.push_back({fmt::format("cuda:{}", i), "CUDA", memory[i].total, memory[i].free});
    }
    return gpus;
  };
  impl->open_devices = [count = probe.device_count](std::string* log) {
    DeviceSet devices;
    std::string line;
    // Ordinals must stay names: stop at the first GPU that fails to open ("cuda:N" is index N).
    for (int i = 0; i < count; ++i) {
      auto device = cuda::CudaDevice::Open(i);
      if (!device.ok()) {
        line = "cuda:" + std::to_string(i) + " and above not used: " + device.status().ToString();
        break;
      }
      devices.push_back(*std::move(device));
    }
    if (line.empty()) {
      line = "CUDA: " + std::to_string(devices.size()) + " GPU(s)";
      for (const auto& d : devices) line += "; " + d->Info().name + " " + d->Info().description;
    }
    if (log) *log = std::move(line);
    return devices;
  };
}

}  // namespace loadstone::device
