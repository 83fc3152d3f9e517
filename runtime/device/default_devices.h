// The devices a Loader finds on this machine. Which implementation is compiled is chosen by
// CMake (default_devices_cuda.cc when the CUDA backend is built, default_devices_none.cc
// otherwise) — no #ifdef in shared code.
#ifndef LOADSTONE_RUNTIME_DEVICE_DEFAULT_DEVICES_H_
#define LOADSTONE_RUNTIME_DEVICE_DEFAULT_DEVICES_H_

#include <string>

#include "runtime/device/device.h"

namespace loadstone::device {

// Opens every usable accelerator, in ordinal order ("cuda:0" first). None: an empty set, and
// `*log` says why ("built without CUDA", "no CUDA driver", ...). Called once per Loader.
DeviceSet OpenDefaultDevices(std::string* log);

}  // namespace loadstone::device

#endif  // LOADSTONE_RUNTIME_DEVICE_DEFAULT_DEVICES_H_
