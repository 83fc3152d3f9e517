// Test seams of the pipeline (not part of the public API).
#ifndef LOADSTONE_RUNTIME_PIPELINE_TESTING_H_
#define LOADSTONE_RUNTIME_PIPELINE_TESTING_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/reader.h"
#include "runtime/device/device.h"
#include "loadstone/loader.h"

namespace loadstone::pipeline {

using ReaderFactory = std::function<Result<std::unique_ptr<io::Reader>>(
    const std::vector<std::string>& paths, const io::ReaderOptions& options, std::string* log)>;

// Loads started after this call open their reader through `factory` (e.g. to wrap it in a
// FaultInjectingReader). REQUIRES: no load is running on `loader`.
void SetReaderFactoryForTesting(Loader& loader, ReaderFactory factory);

// Loads started after this call place "cuda:N" tensors on devices[N] (e.g. SimDevices).
// REQUIRES: no load is running on `loader`.
void SetDevicesForTesting(Loader& loader, device::DeviceSet devices);

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_TESTING_H_
