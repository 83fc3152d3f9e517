// infer_auto_device_map: accelerate's greedy placement, step for step.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_GREEDY_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_GREEDY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstone/device_map.h"
#include "runtime/device_map/budgets.h"
#include "runtime/device_map/layers.h"
#include "runtime/device_map/module_sizes.h"
#include "runtime/device_map/no_split.h"

namespace loadstone::device_map {

// find_tied_parameters: each group's names sorted; groups in the traversal order of their
// first parameter (accelerate's order depends on set iteration; see docs/device-map.md).
std::vector<std::vector<std::string>> FindTiedGroups(const ModuleTree::Impl& tree);

// Which tied groups may hold a name that `name` lies inside (TieContains), found without a scan
// of every group: an index of the dotted components of every tied name, whole and (for a name's
// first component, which the reference's substring test also finds inside a component: "1." in
// "11.w.") every suffix of each. Building it and each lookup are linear in the names' lengths.
class TieIndex {
 public:
  TieIndex() = default;
  explicit TieIndex(const std::vector<std::vector<std::string>>& groups);

  // A superset of the groups with a member k such that TieContains(name, k), in group order.
  const std::vector<uint32_t>& Candidates(std::string_view name) const;

 private:
  std::unordered_map<uint64_t, std::vector<uint32_t>> whole_;     // component → groups
  std::unordered_map<uint64_t, std::vector<uint32_t>> suffixes_;  // suffix of a component → groups
};

struct PlanContext {
  const ModuleTree::Impl* tree = nullptr;
  const ModuleSizes* sizes = nullptr;
  const NoSplit* no_split = nullptr;
  const SizePolicy* policy = nullptr;
  std::vector<std::vector<std::string>> tied_groups;
  TieIndex tie_index;  // of tied_groups
  bool offload_buffers = false;
  bool fallback_allocation = false;
  ReferenceFixes fixes;
  bool explain = false;
};

// An ordered dict of name -> device, with Python's "assigning an existing key keeps its place".
class OrderedPlacement {
 public:
  void Set(const std::string& name, Device device);
  const std::vector<DeviceMap::Entry>& entries() const { return entries_; }

 private:
  std::vector<DeviceMap::Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

struct Placement {
  OrderedPlacement map;                                // before clean_device_map
  std::vector<std::pair<Device, PyNum>> used;          // device_memory_used, every device
  std::vector<std::pair<Device, PyNum>> buffer_bytes;  // device_buffer_sizes
  std::vector<std::pair<Device, PyNum>> min_required;  // device_minimum_assignment_memory
  std::vector<std::string> explanation;
};

// The devices accelerate walks: the budget keys, then "disk" when absent.
std::vector<Device> PlacementDevices(const Budgets& budgets);

Placement GreedyPlace(const PlanContext& ctx, const Budgets& budgets);

// The tied-parameter tests: "name is inside k" (`name + "." in k + "."`, or with
// fixes.prefix_tie_test a dotted-prefix test).
bool TieContains(const PlanContext& ctx, std::string_view name, std::string_view k);

// The tied parameters outside `name` that matter for it (accelerate's tied_params).
std::vector<std::string> TiedParamsOutside(const PlanContext& ctx, const std::string& name,
                                           std::vector<std::vector<std::string>>* groups);

// get_module_size_with_ties over `todo`; `modules` receives the index in `todo` of each tied
// module (or -1 when none contains the parameter: accelerate raises IndexError there).
PyNum SizeWithTies(const PlanContext& ctx, const std::vector<std::string>& tied_params,
                   PyNum module_size, const Todo& todo, std::vector<ptrdiff_t>* modules);

// fallback_allocate: the first entry (depth-first, splitting) that fits `size_limit`; on success
// `*todo` becomes [found, rest...] with its ancestors expanded, and true is returned.
bool FallbackAllocate(const PlanContext& ctx, Todo* todo, PyNum size_limit, Entry* found);

// Python's repr of a list of strings: ['a', 'b'].
std::string PyListRepr(const std::vector<std::string>& items);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_GREEDY_H_
