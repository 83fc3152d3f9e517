#include "runtime/sim/simulated_platform.h"

#include "runtime/device/platform_impl.h"
#include "runtime/sim/sim_device.h"

namespace loadstone {

std::shared_ptr<const Platform> SimulatedPlatformWithDevices(const SimulatedMachine& machine) {
  Platform::Impl impl = PlatformAccess::Get(*Platform::Simulated(machine));
  impl.open_devices = [gpus = impl.gpus(), description = impl.description](std::string* log) {
    device::DeviceSet devices;
    for (const PlatformGpu& gpu : gpus) {
      devices.push_back(std::make_shared<device::SimDevice>(
          device::SimDeviceOptions{.name = gpu.name, .memory_bytes = gpu.memory_bytes}));
    }
    if (log) *log = description + " (host memory behind the device interface)";
    return devices;
  };
  return PlatformAccess::Make(std::move(impl));
}

}  // namespace loadstone
