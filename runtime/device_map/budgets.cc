#include "runtime/device_map/budgets.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loadstone {
namespace device_map {

const Budget* FindBudget(const Budgets& budgets, Device device) {
  for (const Budget& b : budgets) {
    if (b.device == device) return &b;
  }
  return nullptr;
}

Budget* FindBudget(Budgets& budgets, Device device) {
  for (Budget& b : budgets) {
    if (b.device == device) return &b;
  }
  return nullptr;
}

Result<Device> ParseBudgetKey(const std::string& key) {
  auto device = ParseDevice(key);
  if (device.ok() && key != "cuda") return *device;
  return Status::InvalidArgument(fmt::format(
      "Device {} is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' "
      "and 'disk'",
      key));
}

Result<Budgets> GetMaxMemory(const std::optional<MaxMemory>& max_memory, const Platform& platform,
                             std::vector<std::string>* warnings) {
  Budgets budgets;
  const std::vector<PlatformGpu> gpus = platform.Gpus();
  if (!max_memory) {
    for (size_t i = 0; i < gpus.size(); ++i) {
      budgets.push_back({Device::Cuda(static_cast<int>(i)),
                         PyNum::Int(static_cast<int64_t>(std::min<uint64_t>(gpus[i].free_bytes, INT64_MAX)))});
    }
    LOADSTONE_ASSIGN_OR_RETURN(uint64_t ram, platform.AvailableHostBytes());
    budgets.push_back({Device::Cpu(), PyNum::Int(static_cast<int64_t>(std::min<uint64_t>(ram, INT64_MAX)))});
    return budgets;
  }
  for (const auto& [key, value] : *max_memory) {
    LOADSTONE_ASSIGN_OR_RETURN(Device device, ParseBudgetKey(key));
    PyNum bytes;
    if (const auto* i = std::get_if<int64_t>(&value)) {
      bytes = PyNum::Int(*i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      bytes = PyNum::Float(*d);
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t parsed, ParseSizeString(std::get<std::string>(value)));
      bytes = parsed > INT64_MAX ? PyNum::Float(static_cast<double>(parsed))
                                 : PyNum::Int(static_cast<int64_t>(parsed));
    }
    if (FindBudget(budgets, device) != nullptr) {
      return Status::InvalidArgument(
          fmt::format("max_memory gives {} twice (key '{}')", device.ToString(), key));
    }
    budgets.push_back({device, bytes});
  }
  std::stable_sort(budgets.begin(), budgets.end(),
                   [](const Budget& a, const Budget& b) { return a.device < b.device; });
  // accelerate warns about GPUs the machine does not have; a machine without any (planning for
  // budgets given in full, accelerate's tests on a CPU) gets no such warning.
  if (!gpus.empty() && warnings) {
    std::vector<size_t> available(gpus.size());
    for (size_t i = 0; i < available.size(); ++i) available[i] = i;
    for (const Budget& b : budgets) {
      if (b.device.is_gpu() && static_cast<size_t>(b.device.index) >= gpus.size()) {
        warnings->push_back(fmt::format("Device {} is not available, available devices are [{}]",
                                        b.device.index, fmt::join(available, ", ")));
      }
    }
  }
  return budgets;
}

}  // namespace device_map
}  // namespace loadstone
