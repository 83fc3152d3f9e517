// ProbeGpus without the CUDA backend: no GPU. CMake compiles this or cuda/cuda_platform.cc.
#include "runtime/device/platform_impl.h"

namespace loadstone::device {

void ProbeGpus(Platform::Impl* impl) {
  impl->description = "CPU only: no CUDA device: built without the CUDA backend";
  impl->gpus = [] { return std::vector<PlatformGpu>{}; };
  impl->open_devices = [description = impl->description](std::string* log) {
    if (log) *log = description;
    return DeviceSet{};
  };
}

}  // namespace loadstone::device
