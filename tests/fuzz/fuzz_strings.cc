// The small languages a user types: the first byte picks a size string ("10GiB"), a device
// ("cuda:1"), a device-map string ("auto", "balanced_low_0", a JSON map), a --max-memory key, or
// a model-description JSON.
#include "fuzz_input.h"
#include "loadstone/device_map.h"
#include "runtime/device_map/budgets.h"
#include "runtime/device_map/modes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  if (size == 0) return 0;
  const std::string_view text = fuzz::AsText(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0: fuzz::CheckRefusal(ParseSizeString(text).status()); break;
    case 1: fuzz::CheckRefusal(ParseDevice(text).status()); break;
    case 2: fuzz::CheckRefusal(device_map::ParseDeviceMapString(text).status()); break;
    case 3: fuzz::CheckRefusal(device_map::ParseBudgetKey(std::string(text)).status()); break;
    default: fuzz::CheckRefusal(ParseModelDescription(text).status());
  }
  return 0;
}
