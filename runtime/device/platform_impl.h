// What a Platform is made of, for the code that builds one (the default probe, the simulated
// machine, tests) and the code that uses one (the device map's budgets, the Loader).
#ifndef LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_
#define LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loadstone/platform.h"
#include "runtime/device/accelerator.h"

namespace loadstone {

struct Platform::Impl {
  bool simulated = false;
  std::string description;
  uint64_t page_size = 4096;
  std::function<std::vector<PlatformGpu>()> gpus;  // free memory now
  std::function<Result<uint64_t>()> host_bytes;
  // The devices a Loader places "cuda:N" tensors on (devices[N]), opened once per Loader;
  // `*log` says what was found or why nothing was.
  std::function<device::DeviceSet(std::string* log)> open_devices;
};

struct PlatformAccess {
  static std::shared_ptr<const Platform> Make(Platform::Impl impl);
  static const Platform::Impl& Get(const Platform& platform) { return *platform.impl_; }
};

namespace device {

// The platform `chosen` or, when null, Platform::Default().
const Platform& OrDefault(const std::shared_ptr<const Platform>& chosen);

// This machine's GPUs and how to open them: implemented by the CUDA backend when it is built
// (cuda/cuda_platform.cc), else by runtime/device/no_gpus.cc. Sets `impl->gpus`,
// `impl->open_devices` and the GPU part of `impl->description`.
void ProbeGpus(Platform::Impl* impl);

}  // namespace device
}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_
