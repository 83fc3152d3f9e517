// clean_device_map: keys whose sub-keys all share one device collapse into their prefix.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_CLEAN_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_CLEAN_H_

#include <vector>

#include "loadstone/device_map.h"

namespace loadstone::device_map {

// accelerate's clean_device_map. A prefix with at least two keys below it, all on one device,
// becomes one key appended at the end (or updated in place when it is a key already); the root
// collapses to "". accelerate visits sibling prefixes in Python set order (hash-seeded); loadstone
// visits them in order of first appearance, so the result is deterministic.
std::vector<DeviceMap::Entry> CleanDeviceMap(const std::vector<DeviceMap::Entry>& entries);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_CLEAN_H_
