// The CUDA variant of OpenDefaultDevices: one CudaDevice per visible GPU, and the planner's GPU
// memory probe. No CUDA headers here: everything goes through cuda/'s CUDA-free headers.
#include <string>

#include "cuda/cuda_device.h"
#include "cuda/probe.h"
#include "loadstone/device_map.h"
#include "runtime/device/default_devices.h"

namespace loadstone::device {

DeviceSet OpenDefaultDevices(std::string* log) {
  const cuda::CudaProbeResult probe = cuda::ProbeCuda();
  std::string line;
  DeviceSet devices;
  if (probe.device_count == 0) {
    line = "CPU only: no CUDA device: " + probe.reason;
  } else {
    // Ordinals must stay names: stop at the first GPU that fails to open ("cuda:N" is index N).
    for (int i = 0; i < probe.device_count; ++i) {
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
  }
  SetGpuMemoryProbe(devices.empty() ? GpuMemoryProbe() : GpuMemoryProbe([] {
    return cuda::CudaFreeBytesPerDevice();
  }));
  if (log) *log = std::move(line);
  return devices;
}

}  // namespace loadstone::device
