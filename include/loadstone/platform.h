// Platform: the machine a plan is made for and a Loader runs on, as one value — its GPUs and
// their free memory, its host memory, its page size — instead of process-wide probes.
//
//   auto machine = loadstone::Platform::Default();        // this machine, probed once
//   auto capacity = loadstone::Platform::Simulated(       // one you are not on
//       loadstone::SimulatedMachine::Gpus(2, 80ULL << 30));
//   loadstone::PlanOptions opt;
//   opt.device_map = "auto";
//   opt.platform = capacity;                              // plan for it
//
// A simulated platform is for planning: it has no device behind its GPUs, so a Loader on it
// loads CPU tensors and refuses a plan that puts tensors on them — unless the machine asks for
// simulated devices (SimulatedMachine::devices: host memory behind the device interface), as
// tests and `loadstone load --assume-gpus` do to run such plans end to end without a GPU.
//
// Thread safety: a Platform is immutable; share it freely.
#ifndef LOADSTONE_PLATFORM_H_
#define LOADSTONE_PLATFORM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstone/status.h"

namespace loadstone {

struct PlatformGpu {
  std::string name;           // "cuda:0"
  std::string description;    // "NVIDIA H200 ..." or "simulated"
  uint64_t memory_bytes = 0;  // total
  uint64_t free_bytes = 0;    // free when asked (Platform::Gpus)
  // It decodes quantized weights itself (the CUDA backend's kernels): Plan() sends them to it
  // packed (ConversionSite::kDevice); false: the workers decode them, the GPU copies the values.
  bool decodes_quantized = true;
};

// What Platform::Simulated builds: one GPU per entry of `gpu_bytes` (its memory, all free), and
// `host_bytes` of available host memory (unset: this machine's).
struct SimulatedMachine {
  std::vector<uint64_t> gpu_bytes;
  std::optional<uint64_t> host_bytes;
  // Open one simulated device per GPU (host memory behind the device interface, with the
  // device's own copy and conversion work), so that a Loader on this machine places "cuda:N"
  // tensors there; false: the machine is for planning only.
  bool devices = false;
  // Its GPUs decode quantized weights themselves (PlatformGpu::decodes_quantized), as the CUDA
  // backend's do; false: as GPUs without those kernels.
  bool decodes_quantized = true;
  // This machine with `devices` set.
  SimulatedMachine WithDevices() const;

  // `count` GPUs of `bytes` each.
  static SimulatedMachine Gpus(int count, uint64_t bytes);
};

class Platform {
 public:
  // This machine: its GPUs through the CUDA backend when it is built, its host memory
  // (MemAvailable), its page size. Probed on first use; every call returns the same object.
  static std::shared_ptr<const Platform> Default();
  // A machine you are not on, for planning (see above).
  static std::shared_ptr<const Platform> Simulated(const SimulatedMachine& machine);

  ~Platform();
  Platform(const Platform&) = delete;
  Platform& operator=(const Platform&) = delete;

  bool simulated() const;
  // The GPUs in ordinal order ("cuda:N" is entry N), with their free memory now.
  std::vector<PlatformGpu> Gpus() const;
  // Host memory available now, as psutil reports it. Errors: IOError.
  Result<uint64_t> AvailableHostBytes() const;
  uint64_t page_size() const;
  // One line: "CUDA: 1 GPU(s); NVIDIA H200 ...", "CPU only: no CUDA device: ...",
  // "simulated: 2 GPUs of 80.00 GiB".
  const std::string& description() const;

  struct Impl;  // runtime/device/platform_impl.h

 private:
  friend struct PlatformAccess;
  explicit Platform(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loadstone

#endif  // LOADSTONE_PLATFORM_H_
