// The order of a LoadPlan's tensors (PlanOptions::order, plan.h): the model's modules in the
// order it runs them — its module tree's registration order, or the rules of Hugging Face
// architectures on the names — as stored, or as the caller gives them; and the cut of the
// planned tensors into those modules (LoadPlan::modules). Pure functions of names and options.
#ifndef LOADSTONE_RUNTIME_PLAN_EXEC_ORDER_H_
#define LOADSTONE_RUNTIME_PLAN_EXEC_ORDER_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"

namespace loadstone::planning {

// Natural order of dotted names: numeric components compare as numbers ("layers.2" before
// "layers.10"), numbers before names at the same level, the rest as text.
bool NaturalLess(std::string_view a, std::string_view b);

// The module of the order tensor `name` is in: its name up to its first number
// ("model.layers.3" of "model.layers.3.mlp.up_proj.weight"), or up to a component that is one
// module the rules place as a whole ("time_embedding" of "time_embedding.linear_1.bias": an
// embedding, a final norm, a head, "mid_block"), else its parent module; a name without a dot is
// its own.
std::string_view OrderModuleOf(std::string_view name);

// Whether the catalog's tensors are in file order: by file, then offset (each safetensors file's
// by offset, as Open catalogs them; a PyTorch archive's need not be).
bool FileOrdered(const std::vector<TensorInfo>& infos);

struct TensorOrdering {
  std::vector<size_t> order;  // every checkpoint tensor, as indices into Checkpoint::tensors()
  // The module of each checkpoint tensor (by index): a view into its name or into
  // PlanOptions::order_prefixes.
  std::vector<std::string_view> module;
};

// The tensors of `checkpoint` in `options.order`, module by module, each module's tensors in file
// order. Errors: InvalidArgument (kGiven: no prefix, an empty one, or one no tensor is under).
Result<TensorOrdering> OrderTensors(const Checkpoint& checkpoint, const PlanOptions& options);

// plan->modules: plan->tensors cut into runs of one module (`module_of_source`, by
// TensorPlan::source).
void CutModules(const std::vector<std::string_view>& module_of_source, LoadPlan* plan);

}  // namespace loadstone::planning

#endif  // LOADSTONE_RUNTIME_PLAN_EXEC_ORDER_H_
