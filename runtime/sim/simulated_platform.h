// Simulated devices behind a simulated platform: test and tool support, not part of
// libloadstone.so. Platform::Simulated (platform.h) describes a machine for planning; this one
// also opens one SimDevice per GPU (host memory behind the device interface), so that a plan for
// that machine loads end to end without a GPU — the tests' multi-device loads and
// `loadstone load --assume-gpus`.
#ifndef LOADSTONE_RUNTIME_SIM_SIMULATED_PLATFORM_H_
#define LOADSTONE_RUNTIME_SIM_SIMULATED_PLATFORM_H_

#include <memory>

#include "loadstone/platform.h"

namespace loadstone {

std::shared_ptr<const Platform> SimulatedPlatformWithDevices(const SimulatedMachine& machine);

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_SIM_SIMULATED_PLATFORM_H_
