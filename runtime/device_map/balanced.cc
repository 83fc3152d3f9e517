// get_balanced_memory: budgets that spread the model over the GPUs.
#include <fmt/format.h>

#include "runtime/device_map/budgets.h"

namespace loadstone::device_map {
namespace {

// The size of the first module (in module_sizes order) of each no-split entry; the largest.
PyNum NoSplitBlockSize(const BalanceInput& in) {
  const NoSplit& no_split = *in.no_split;
  if (no_split.empty()) return PyNum();
  std::vector<bool> found(no_split.entries().size(), false);
  std::vector<PyNum> found_sizes;
  size_t found_count = 0;
  for (int32_t node : in.sizes->node_order) {
    if (node == 0) continue;
    for (size_t i = 0; i < found.size(); ++i) {
      if (found[i] || !no_split.EntryMatches(i, node)) continue;
      found[i] = true;
      ++found_count;
      found_sizes.push_back(in.sizes->node[static_cast<size_t>(node)]);
      // Entries spelled twice count once.
      for (size_t j = i + 1; j < found.size(); ++j) {
        if (!found[j] && no_split.entries()[j] == no_split.entries()[i]) {
          found[j] = true;
          ++found_count;
        }
      }
    }
    if (found_count == found.size()) break;
  }
  if (found_sizes.empty()) return PyNum();
  PyNum largest = found_sizes.front();
  for (const PyNum& s : found_sizes) largest = PyMax(largest, s);
  return largest;
}

// int(mean size of the last-level modules): modules with tensors but no child module with
// tensors, summed in module_sizes order.
PyNum MeanLeafModuleSize(const BalanceInput& in) {
  const ModuleTree::Impl& tree = *in.tree;
  std::vector<bool> touched(tree.nodes.size(), false);
  for (int32_t node : in.sizes->node_order) touched[static_cast<size_t>(node)] = true;
  PyNum sum;
  int64_t count = 0;
  for (int32_t node : in.sizes->node_order) {
    if (node == 0) continue;
    bool has_touched_child = false;
    for (int32_t child : tree.nodes[static_cast<size_t>(node)].children) {
      if (touched[static_cast<size_t>(child)]) {
        has_touched_child = true;
        break;
      }
    }
    if (has_touched_child) continue;
    sum += in.sizes->node[static_cast<size_t>(node)];
    ++count;
  }
  double mean = sum.AsDouble() / static_cast<double>(std::max<int64_t>(count, 1));
  return PyNum::Int(PyNum::Float(mean).Trunc());
}

}  // namespace

Result<Budgets> GetBalancedMemory(const BalanceInput& in, const std::optional<MaxMemory>& max_memory,
                                  bool low_zero, std::vector<std::string>* warnings) {
  bool user_unset = !max_memory.has_value();
  LOADSTONE_ASSIGN_OR_RETURN(Budgets budgets, GetMaxMemory(max_memory, *in.platform, warnings));
  int64_t num_gpus = 0;
  for (const Budget& b : budgets) {
    if (b.device.is_gpu() && b.bytes > PyNum::Int(0)) ++num_gpus;
  }
  if (num_gpus == 0) return budgets;
  if (num_gpus == 1) {
    low_zero = false;
    if (user_unset) {
      for (Budget& b : budgets) {
        if (!b.device.is_gpu()) continue;
        b.bytes = b.bytes * PyNum::Float(0.9);
        break;
      }
    }
  }
  PyNum total = in.sizes->node[0];
  PyNum per_gpu = total.FloorDiv(low_zero ? num_gpus - 1 : num_gpus);
  PyNum buffer = NoSplitBlockSize(in);
  PyNum mean = MeanLeafModuleSize(in);
  buffer = PyNum::Int((PyNum::Float(1.25) * PyMax(buffer, mean)).Trunc());
  per_gpu += buffer;

  std::vector<Budget*> gpus;
  for (Budget& b : budgets) {
    if (b.device.is_gpu() && b.bytes > PyNum::Int(0)) gpus.push_back(&b);
  }
  for (size_t k = 0; k + 1 < gpus.size(); ++k) {
    Budget& b = *gpus[k];
    b.bytes = PyMin(low_zero && b.device.index == 0 ? b.bytes : per_gpu, b.bytes);
  }
  if (low_zero) {
    auto missing = [&](int index) {
      return Status::InvalidArgument(fmt::format(
          "balanced_low_0 needs budgets for GPUs 0..{} (accelerate reads max_memory[i] for each); "
          "GPU {} has none",
          num_gpus - 1, index));
    };
    PyNum others;
    for (int i = 1; i < num_gpus; ++i) {
      const Budget* b = FindBudget(budgets, Device::Cuda(i));
      if (b == nullptr) return missing(i);
      others += b->bytes;
    }
    Budget* zero = FindBudget(budgets, Device::Cuda(0));
    if (zero == nullptr) return missing(0);
    PyNum min_zero = PyMax(PyNum::Int(0), total - others);
    zero->bytes = PyMin(min_zero, zero->bytes);
  }
  return budgets;
}

}  // namespace loadstone::device_map
