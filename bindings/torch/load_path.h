// The LibTorch face's one load path, shared by its state-dict load (torch.cc) and its module
// load (module_load.cc): the casting rule, the planning options, the Loader, the disk tensors,
// and a loaded tensor handed over as an at::Tensor. Internal to bindings/torch.
#ifndef LOADSTONE_BINDINGS_TORCH_LOAD_PATH_H_
#define LOADSTONE_BINDINGS_TORCH_LOAD_PATH_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "loadstone/torch.h"

namespace loadstone::libtorch {

// What one tensor becomes: the dtype the plan loads it as, and a LibTorch cast after that when
// the target is one loadstone does not cast to (float64, say).
struct CastRule {
  std::map<std::string, DType> special;          // for PlanOptions::special_dtypes
  std::map<std::string, c10::ScalarType> after;  // cast by LibTorch once loaded
};

// The one casting rule. `model`: the model tensor each checkpoint tensor fills, by the
// checkpoint tensor's name (a module load), else empty.
Result<CastRule> CastTargets(const Checkpoint& checkpoint,
                             const std::unordered_set<std::string>* include,
                             const TorchLoadOptions& options,
                             const std::vector<std::string>& keep_in_fp32,
                             const std::unordered_map<std::string, at::Tensor>& model);

// The machine planned for and loaded on: the given Loader's, else the options', else this one.
std::shared_ptr<const Platform> PlatformOf(const TorchLoadOptions& options);
// The given Loader, else one on PlatformOf(options).
std::shared_ptr<Loader> LoaderOf(const TorchLoadOptions& options);
// The device map and the planning options every load shares.
Result<PlanOptions> BasePlanOptions(const TorchLoadOptions& options);
Result<Checkpoint> OpenAt(const std::string& path, const TorchLoadOptions& options);

// A loaded tensor as an at::Tensor over the same memory, which it keeps alive.
Result<at::Tensor> Wrap(const loadstone::Tensor& t, bool simulated);

// The keys decoded packed weights are handed over under (TensorInfo::decoded_name), by
// checkpoint name.
using Renames = std::unordered_map<std::string_view, std::string_view>;
Renames RenamesOf(const Checkpoint& checkpoint, const LoadPlan& plan);
// A loaded tensor as it is handed over: its key, and the at::Tensor over it (cast by the rule's
// LibTorch cast, if it has one).
Result<std::pair<std::string, at::Tensor>> HandOver(const loadstone::Tensor& t,
                                                     const Renames& renamed, const CastRule& rule,
                                                     bool simulated);

// The placement's map, warnings and platform from `plan`; its disk tensors written (WriteOffload)
// and kept in an OffloadStore.
Status AttachOffload(const std::shared_ptr<Loader>& loader, const Checkpoint& checkpoint,
                     const LoadPlan& plan, Placement* placement);

}  // namespace loadstone::libtorch

#endif  // LOADSTONE_BINDINGS_TORCH_LOAD_PATH_H_
