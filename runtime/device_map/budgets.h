// Budgets per device: accelerate's get_max_memory and get_balanced_memory.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_BUDGETS_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_BUDGETS_H_

#include <optional>
#include <string>
#include <vector>

#include "loadstone/device_map.h"
#include "loadstone/platform.h"
#include "runtime/device_map/module_sizes.h"
#include "runtime/device_map/no_split.h"
#include "runtime/device_map/py_number.h"

namespace loadstone::device_map {

struct Budget {
  Device device;
  PyNum bytes;
};

// In accelerate's device order: GPUs by ordinal, mps, cpu, disk.
using Budgets = std::vector<Budget>;

// nullptr when the device has no budget.
const Budget* FindBudget(const Budgets& budgets, Device device);
Budget* FindBudget(Budgets& budgets, Device device);

// A max_memory key: "N" or "cuda:N", "mps", "cpu", "disk".
// Errors: InvalidArgument with accelerate's "Device X is not recognized" message.
Result<Device> ParseBudgetKey(const std::string& key);

// get_max_memory on `platform`. Unset: each GPU's free bytes, then cpu = available host memory.
// Warns (into *warnings) about GPU ordinals the platform does not have, when it has GPUs.
Result<Budgets> GetMaxMemory(const std::optional<MaxMemory>& max_memory, const Platform& platform,
                             std::vector<std::string>* warnings);

struct BalanceInput {
  const ModuleTree::Impl* tree;
  const ModuleSizes* sizes;
  const NoSplit* no_split;
  const Platform* platform;
};

// get_balanced_memory (low_zero for "balanced_low_0").
Result<Budgets> GetBalancedMemory(const BalanceInput& input,
                                  const std::optional<MaxMemory>& max_memory, bool low_zero,
                                  std::vector<std::string>* warnings);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_BUDGETS_H_
