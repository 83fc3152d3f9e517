// Renamed: Device, DeviceMap, ParseDevice, ParseSizeString, SizeValue and MaxMemory are declared
// in loadstone/device_map.h, beside the functions that plan device maps (one header for devices
// and their maps). This header is kept so that code including it still builds; include
// loadstone/device_map.h instead. It will be removed in a later release.
#ifndef LOADSTONE_DEVICES_H_
#define LOADSTONE_DEVICES_H_

#include "loadstone/device_map.h"

#endif  // LOADSTONE_DEVICES_H_
