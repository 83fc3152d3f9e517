// Python values → loadstone's option structs, checked once at the edge (unknown keys are a
// TypeError, bad values a loadstone InvalidArgumentError naming the option).
#ifndef LOADSTONE_PYTHON_OPTIONS_H_
#define LOADSTONE_PYTHON_OPTIONS_H_

#include <memory>
#include <string>

#include <nanobind/nanobind.h>

#include "loadstone/device_map.h"
#include "loadstone/plan.h"
#include "loadstone/platform.h"

namespace loadstone::python {

// A dtype argument: a torch dtype's name ("torch.bfloat16", "bfloat16", "bf16", ...), or any
// object whose str() is one (a torch.dtype). Errors: InvalidArgument naming `option`.
DType ParseDTypeArg(nanobind::handle value, const char* option);

// accelerate's max_memory: {0: "10GiB", "cpu": 2**30, "disk": ...}; keys ints or strings.
MaxMemory ParseMaxMemory(nanobind::handle value);

// An ordered device map: a dict or a sequence of (prefix, device) pairs; devices as ints,
// "cpu", "disk", "cuda:N" or anything whose str() is one (a torch.device).
DeviceMap ParseDeviceMap(nanobind::handle value);

// The platform option: None (this machine) or {"gpus": [bytes, ...], "host": bytes} (simulated,
// for planning only).
std::shared_ptr<const Platform> ParsePlatform(nanobind::handle value);

// The device-map options (device_map.h) from `kwargs`, consuming the keys it knows: device_map,
// max_memory, dtype, no_split, keep_in_fp32, special_dtypes, offload_buffers,
// fallback_allocation, strategy, clean_result, explain, platform.
void TakeDeviceMapOptions(nanobind::dict& kwargs, DeviceMapOptions& options);

// Every plan option: the device-map ones, plus explicit_map, model_json, include,
// caller_memory, offload_folder, offload_in_place, keep_packed, pin_cpu_tensors, mmap, align_tensors,
// fp8_block, max_chunk. A key left over is a TypeError.
PlanOptions ParsePlanOptions(nanobind::dict kwargs);

// A DeviceMap as accelerate's ordered dict: GPUs as ints, "mps", "cpu", "disk".
nanobind::dict DeviceMapToPython(const DeviceMap& map);

// Device → accelerate's value (0, "cpu", "disk").
nanobind::object DeviceToPython(const Device& device);

// The bytes per device of a device plan: [{device, bytes, budget (None when none)}].
nanobind::list UsageToPython(const DevicePlan& plan);

}  // namespace loadstone::python

#endif  // LOADSTONE_PYTHON_OPTIONS_H_
