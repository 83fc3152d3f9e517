// What a Platform is made of, for the code that builds one (the default probe, the simulated
// machine, tests) and the code that uses one (the planner's budgets, the Loader).
#ifndef LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_
#define LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/reader.h"
#include "loadstone/platform.h"
#include "runtime/device/device.h"

namespace loadstone {

// How a load opens its reader; io::OpenReader unless a test wraps it (fault injection).
using ReaderFactory = std::function<Result<std::unique_ptr<io::Reader>>(
    const std::vector<std::string>& paths, const io::ReaderOptions& options, std::string* log)>;

// Points in a load where a test cancels it on purpose (LoadHooks::cancel_at): as the first
// reads are about to be issued, once the first read is back, as a worker starts a conversion,
// as a device job is submitted.
enum class LoadStage { kBeforeFirstRead, kMidStream, kConverting, kDeviceCopy };

// How a test changes a load on this platform (fault injection); all unset in production.
struct LoadHooks {
  ReaderFactory open_reader;  // unset: io::OpenReader
  // Asked at each LoadStage (from the thread at that stage); true cancels the load there, as
  // LoadHandle::Cancel from another thread at that moment would. Unset: never.
  std::function<bool(LoadStage stage)> cancel_at;
  // Asked as a load opens fresh pages: true refuses them, as a kernel without userfaultfd
  // (vm.unprivileged_userfaultfd = 0) would. Unset: never.
  std::function<bool()> refuse_userfaultfd;
};

struct Platform::Impl {
  bool simulated = false;
  std::string description;
  uint64_t page_size = 4096;
  std::function<std::vector<PlatformGpu>()> gpus;  // free memory now
  std::function<Result<uint64_t>()> host_bytes;
  // The devices a Loader places "cuda:N" tensors on (devices[N]), opened once per Loader;
  // `*log` says what was found or why nothing was.
  std::function<device::DeviceSet(std::string* log)> open_devices;
  LoadHooks hooks;
};

struct PlatformAccess {
  static std::shared_ptr<const Platform> Make(Platform::Impl impl);
  static const Platform::Impl& Get(const Platform& platform) { return *platform.impl_; }
};

namespace device {

// The platform `chosen` or, when null, Platform::Default().
const Platform& OrDefault(const std::shared_ptr<const Platform>& chosen);

// This machine's GPUs and how to open them: implemented by the CUDA backend when it is built
// (cuda/cuda_platform.cc), else by runtime/device/no_gpus.cc. Sets `impl->gpus`,
// `impl->open_devices` and the GPU part of `impl->description`.
void ProbeGpus(Platform::Impl* impl);

}  // namespace device
}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_DEVICE_PLATFORM_IMPL_H_
