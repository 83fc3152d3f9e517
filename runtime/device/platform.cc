#include "loadstone/platform.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "runtime/device/platform_impl.h"
#include "runtime/sim/sim_device.h"

namespace loadstone {
namespace {

// MemAvailable from /proc/meminfo (what psutil reports as available).
Result<uint64_t> AvailableRam() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
  }
  return Status::IOError("cannot read the available memory from /proc/meminfo; give max_memory");
}

uint64_t PageSize() {
  const long size = sysconf(_SC_PAGESIZE);
  return size > 0 ? static_cast<uint64_t>(size) : 4096;
}

std::string Bytes(uint64_t bytes) {
  if (bytes % (1ULL << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes % (1ULL << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

}  // namespace

SimulatedMachine SimulatedMachine::WithDevices() const {
  SimulatedMachine machine = *this;
  machine.devices = true;
  return machine;
}

SimulatedMachine SimulatedMachine::Gpus(int count, uint64_t bytes) {
  SimulatedMachine machine;
  machine.gpu_bytes.assign(static_cast<size_t>(std::max(count, 0)), bytes);
  return machine;
}

Platform::Platform(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Platform::~Platform() = default;

bool Platform::simulated() const { return impl_->simulated; }
std::vector<PlatformGpu> Platform::Gpus() const { return impl_->gpus ? impl_->gpus() : std::vector<PlatformGpu>{}; }
Result<uint64_t> Platform::AvailableHostBytes() const { return impl_->host_bytes(); }
uint64_t Platform::page_size() const { return impl_->page_size; }
const std::string& Platform::description() const { return impl_->description; }

std::shared_ptr<const Platform> PlatformAccess::Make(Platform::Impl impl) {
  if (!impl.host_bytes) impl.host_bytes = AvailableRam;
  if (!impl.open_devices) {
    impl.open_devices = [](std::string* log) {
      if (log) *log = "no devices";
      return device::DeviceSet{};
    };
  }
  return std::shared_ptr<const Platform>(new Platform(std::make_unique<Platform::Impl>(std::move(impl))));
}

std::shared_ptr<const Platform> Platform::Default() {
  static const std::shared_ptr<const Platform> probed = [] {
    Platform::Impl impl;
    impl.page_size = PageSize();
    impl.host_bytes = AvailableRam;
    device::ProbeGpus(&impl);
    return PlatformAccess::Make(std::move(impl));
  }();
  return probed;
}

std::shared_ptr<const Platform> Platform::Simulated(const SimulatedMachine& machine) {
  Platform::Impl impl;
  impl.simulated = true;
  impl.page_size = PageSize();
  std::vector<PlatformGpu> gpus;
  for (size_t i = 0; i < machine.gpu_bytes.size(); ++i) {
    gpus.push_back({fmt::format("cuda:{}", i), "simulated", machine.gpu_bytes[i],
                    machine.gpu_bytes[i], machine.decodes_quantized});
  }
  impl.description = gpus.empty() ? "simulated: no GPU" : fmt::format("simulated: {} GPU(s)", gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    impl.description += fmt::format("{} {}", i ? "," : " of", Bytes(gpus[i].memory_bytes));
  }
  impl.gpus = [gpus] { return gpus; };
  if (machine.host_bytes) {
    impl.host_bytes = [bytes = *machine.host_bytes]() -> Result<uint64_t> { return bytes; };
  }
  if (machine.devices) {
    impl.open_devices = [gpus, description = impl.description](std::string* log) {
      device::DeviceSet devices;
      for (const PlatformGpu& gpu : gpus) {
        devices.push_back(std::make_shared<device::SimDevice>(
            device::SimDeviceOptions{.name = gpu.name,
                                     .memory_bytes = gpu.memory_bytes,
                                     .decodes_quantized = gpu.decodes_quantized}));
      }
      if (log) *log = description + " (host memory behind the device interface)";
      return devices;
    };
  } else {
    impl.open_devices = [description = impl.description](std::string* log) {
      if (log) {
        *log = description + ": planning only (SimulatedMachine::devices opens simulated "
                             "devices behind its GPUs)";
      }
      return device::DeviceSet{};
    };
  }
  return PlatformAccess::Make(std::move(impl));
}

namespace device {

const Platform& OrDefault(const std::shared_ptr<const Platform>& chosen) {
  if (chosen) return *chosen;
  static const std::shared_ptr<const Platform> fallback = Platform::Default();
  return *fallback;
}

}  // namespace device
}  // namespace loadstone
