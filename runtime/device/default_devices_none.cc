#include "runtime/device/default_devices.h"

namespace loadstone::device {

DeviceSet OpenDefaultDevices(std::string* log) {
  if (log) *log = "CPU only: no CUDA device: built without the CUDA backend";
  return {};
}

}  // namespace loadstone::device
