// The device_map strings users pass (diffusers / transformers validation).
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_MODES_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_MODES_H_

#include <optional>
#include <string_view>

#include "loadstone/device_map.h"

namespace loadstone::device_map {

enum class Mode { kAuto, kBalanced, kBalancedLow0, kSequential, kSingleDevice };

struct ModeChoice {
  Mode mode = Mode::kAuto;
  Device device;  // kSingleDevice only
};

// "auto" | "balanced" | "balanced_low_0" | "sequential" | a device ("cpu", "cuda", "cuda:1",
// "mps") | an integer N >= 0 (GPU N). Errors: InvalidArgument with diffusers' messages.
Result<ModeChoice> ParseDeviceMapString(std::string_view text);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_MODES_H_
