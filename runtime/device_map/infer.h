// The device-map planner's entry for Plan(): InferDeviceMap sized by the bytes a load places.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_PLANNER_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_PLANNER_H_

#include <string>
#include <vector>

#include "loadstone/device_map.h"
#include "runtime/device_map/module_sizes.h"

namespace loadstone::device_map {

// InferDeviceMap, with each tensor named in `placed` sized as its numel x dtype (what the load
// will place) instead of by accelerate's min(dtype, stored) rule; other tensors keep the rule.
Result<DevicePlan> InferDeviceMapPlaced(const ModuleTree& tree, const DeviceMapOptions& options,
                                        const PlacedTensors& placed);

// The warning check_device_map gives for the keys of `map` that name no module of `tree` (none
// when every key names one): "The following device_map keys do not match any submodules in the
// model: [...]".
std::vector<std::string> UnknownMapKeys(const ModuleTree& tree, const DeviceMap& map);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_PLANNER_H_
