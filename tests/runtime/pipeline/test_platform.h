// Platforms for pipeline tests: a machine whose GPUs are the test's simulated devices; and Loader
// options whose loads open their files through the test's reader (fault injection, LoadHooks),
// switchable off so that a test can check the Loader afterwards.
#ifndef LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_PLATFORM_H_
#define LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_PLATFORM_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "io/fault_reader.h"
#include "loadstone/loader.h"
#include "runtime/device/platform_impl.h"
#include "runtime/pipeline/load_hooks.h"

namespace loadstone::testing {

// This machine's description with `devices` as its GPUs ("cuda:N" = devices[N]).
inline std::shared_ptr<const Platform> TestPlatform(device::DeviceSet devices) {
  Platform::Impl impl;
  impl.description = "test platform";
  std::vector<PlatformGpu> gpus;
  for (const auto& d : devices) {
    gpus.push_back({d->Info().name, d->Info().description, d->Info().total_bytes, d->Info().free_bytes});
  }
  impl.gpus = [gpus] { return gpus; };
  impl.open_devices = [devices](std::string* log) {
    if (log) *log = "devices set by a test";
    return devices;
  };
  return PlatformAccess::Make(std::move(impl));
}

// `options` on a platform whose GPUs are `devices`.
inline LoaderOptions OnDevices(device::DeviceSet devices, LoaderOptions options = {}) {
  options.platform = TestPlatform(std::move(devices));
  return options;
}

// A reader for a Loader's loads that a test turns off (Off()): loads then open the real reader.
class ReaderSwitch {
 public:
  explicit ReaderSwitch(ReaderFactory factory) : factory_(std::move(factory)) {}

  LoaderOptions Options(LoaderOptions options = {}) const {
    LoadHooks hooks;
    hooks.open_reader = [on = on_, factory = factory_](const std::vector<std::string>& paths,
                                                       const io::ReaderOptions& o,
                                                       std::string* log) {
      return on->load() ? factory(paths, o, log) : io::OpenReader(paths, o, log);
    };
    options.hooks = std::make_shared<const LoadHooks>(std::move(hooks));
    return options;
  }
  void Off() { on_->store(false); }

 private:
  ReaderFactory factory_;
  std::shared_ptr<std::atomic<bool>> on_ = std::make_shared<std::atomic<bool>>(true);
};

// Reads held back by `latency` each: with OneReadAtATime, a load still runs when a test acts on
// it.
inline ReaderSwitch SlowReads(std::chrono::milliseconds latency) {
  return ReaderSwitch([latency](const std::vector<std::string>& paths, const io::ReaderOptions& o,
                                std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, o, log));
    io::FaultOptions faults;
    faults.latency = latency;
    LOADSTONE_ASSIGN_OR_RETURN(auto wrapped,
                               io::FaultInjectingReader::Create(std::move(inner), paths, faults));
    return std::unique_ptr<io::Reader>(std::move(wrapped));
  });
}

inline LoaderOptions OneReadAtATime(const ReaderSwitch& reads) {
  LoaderOptions options;
  options.queue_depth = 1;
  return reads.Options(options);
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_TEST_PLATFORM_H_
