// The LibTorch face's module load (include/loadstone/torch.h): StartLoadInto fills a module's
// parameters and persistent buffers as their tensors land — on the load's callback thread, in the
// plan's execution order — so that a caller may run each submodule once ModuleLoad::Module
// resolves; LoadInto is StartLoadInto, then Finish.
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "internal.h"  // beside this file: the binding sees loadstone's public headers only
#include "load_path.h"
#include "model_keys.h"
#include "loadstone/plan.h"
#include "loadstone/state_dict.h"

namespace loadstone::libtorch {
namespace {

// The planning options of a load into `model`: the shared ones, the model's no-split modules
// (for a string device map), and the model's tree.
Result<PlanOptions> ModulePlanOptions(const torch::nn::Module& model,
                                      const TorchLoadOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(PlanOptions popt, BasePlanOptions(options));
  if (!popt.explicit_map) {
    LOADSTONE_ASSIGN_OR_RETURN(popt.no_split, NoSplitModules(model, popt.device_map));
  }
  LOADSTONE_ASSIGN_OR_RETURN(ModelDescription description, DescribeModule(model));
  popt.model = std::move(description.tree);
  return popt;
}

// The modules kept in float32: the options', then the model's own (ModelTraits).
std::vector<std::string> KeepInFp32(const torch::nn::Module& model,
                                    const TorchLoadOptions& options) {
  std::vector<std::string> keep = options.keep_in_fp32_modules;
  if (const auto* traits = dynamic_cast<const ModelTraits*>(&model)) {
    for (std::string& m : traits->keep_in_fp32_modules()) keep.push_back(std::move(m));
  }
  return keep;
}

// copy_into_parameters: the tensors whose parameters, in host memory, contiguous, of the dtype
// the tensor loads as, are the load's destination (nothing allocated, nothing copied after).
std::unordered_set<std::string> DirectFills(const Checkpoint& checkpoint, const Fills& fills,
                                            const CastRule& rule) {
  std::unordered_set<std::string> direct;
  for (const std::string& name : fills.include) {
    const TensorInfo& t = *checkpoint.Find(name);
    const at::Tensor& param = fills.param_of.at(name);
    auto special = rule.special.find(name);
    const DType loads_as = special != rule.special.end() ? special->second : t.dtype;
    auto param_dtype = FromScalarType(param.scalar_type());
    if (param.device().is_cpu() && param.is_contiguous() && !rule.after.contains(name) &&
        param_dtype.ok() && *param_dtype == loads_as) {
      direct.insert(name);
    }
  }
  return direct;
}

// Sets load_options.destination to the memory of the `direct` parameters. Pointers taken now,
// on this thread: the callback runs on the Loader's event loop and must neither call LibTorch
// nor throw.
void SetDestinations(const std::unordered_set<std::string>& direct, const Fills& fills,
                     LoadOptions& load_options) {
  std::unordered_map<std::string_view, std::span<std::byte>> memory;
  for (const std::string& name : direct) {
    const at::Tensor& param = fills.param_of.at(name);
    memory.emplace(name, std::span<std::byte>(static_cast<std::byte*>(param.data_ptr()), param.nbytes()));
  }
  load_options.destination = [memory = std::move(memory)](const TensorInfo& t, const TensorPlan&) {
    auto it = memory.find(t.name);
    return it == memory.end() ? std::span<std::byte>() : it->second;
  };
}

}  // namespace

struct ModuleLoad::Impl {
  TorchLoadOptions options;
  std::optional<Checkpoint> checkpoint;  // set by Start
  LoadPlan plan;
  std::shared_ptr<Loader> loader;
  LoadReport report;
  Fills fills;
  CastRule rule;
  Renames renamed;
  std::unordered_map<std::string, at::Tensor> target;  // the model's tensors, by key
  std::unordered_set<std::string> direct;
  bool simulated = false;
  // Written by the fills on the load's callback thread; read once the load is done.
  std::map<std::string, std::string> device_of;
  std::mutex mu;
  Status fill_error;  // the first fill that failed (guarded by mu)
  bool finished = false;
  LoadHandle load;  // last: destroyed first, it cancels and waits for the fills that use the rest

  // Hands tensor `t` to its parameter or buffer: takes loadstone's buffer, or with
  // copy_into_parameters is copied into (or was read into already). A failure is kept (its code
  // is Finish's) and thrown, which fails the load.
  void Fill(const loadstone::Tensor& t) {
    auto handed = HandOver(t, renamed, rule, simulated);
    Status s = handed.status();
    if (s.ok()) {
      device_of[handed->first] = t.device();
      auto it = target.find(handed->first);
      if (it != target.end()) {  // else loaded with another (a float8 weight's scales)
        s = Guarded(fmt::format("filling '{}'", handed->first), [&]() -> Status {
          torch::NoGradGuard no_grad;
          at::Tensor& param = it->second;
          if (handed->second.data_ptr() == param.data_ptr()) return Status::OK();  // read into it
          if (options.copy_into_parameters) {
            param.copy_(handed->second);
          } else {
            param.set_data(handed->second);
          }
          return Status::OK();
        });
      }
    }
    if (s.ok()) return;
    {
      std::lock_guard lock(mu);
      if (fill_error.ok()) fill_error = s;
    }
    throw Error(std::move(s));
  }

  Status FillError() {
    std::lock_guard lock(mu);
    return fill_error;
  }

  // Plans the load of `model` and starts it; the disk tensors written and their parameters
  // emptied.
  Status Start(torch::nn::Module& model, const std::string& path);
};

Status ModuleLoad::Impl::Start(torch::nn::Module& model, const std::string& path) {
  LOADSTONE_ASSIGN_OR_RETURN(Checkpoint opened, OpenAt(path, options));
  const Checkpoint& ckpt = checkpoint.emplace(std::move(opened));
  LOADSTONE_ASSIGN_OR_RETURN(PlanOptions popt, ModulePlanOptions(model, options));
  // Keys: the model's state dict against the checkpoint's tensors (the one rule of state_dict.h).
  const auto state = PersistentStateDict(model);
  target = std::unordered_map<std::string, at::Tensor>(state.begin(), state.end());
  const KeyMatch match = MatchStateDict(ckpt, ModelKeys(state));
  LOADSTONE_ASSIGN_OR_RETURN(report, ReportKeys(match, path, options));
  fills = FillsOf(ckpt, match, target);
  LOADSTONE_RETURN_IF_ERROR(RefuseUnmatched(model, report, options));

  LOADSTONE_ASSIGN_OR_RETURN(
      rule,
      CastTargets(ckpt, &fills.include, options, KeepInFp32(model, options), fills.param_of));
  popt.special_dtypes = rule.special;
  popt.include = [this](const TensorInfo& t) { return fills.include.contains(t.name); };
  LoadOptions load_options;
  if (options.copy_into_parameters) {
    direct = DirectFills(ckpt, fills, rule);
    popt.caller_memory = [this](const TensorInfo& t) { return direct.contains(t.name); };
    SetDestinations(direct, fills, load_options);
  }
  LOADSTONE_ASSIGN_OR_RETURN(plan, Plan(ckpt, popt));
  renamed = RenamesOf(ckpt, plan);
  loader = LoaderOf(options);
  simulated = loader->platform()->simulated();
  load_options.on_tensor = [this](const loadstone::Tensor& t) { Fill(t); };
  load = loader->Load(ckpt, plan, load_options);
  LOADSTONE_RETURN_IF_ERROR(AttachOffload(loader, ckpt, plan, &report.placement));
  if (report.placement.offloaded) {
    return Guarded("emptying the offloaded parameters", [&]() -> Status {
      torch::NoGradGuard no_grad;
      for (const std::string& name : report.placement.offloaded->names()) {
        auto it = target.find(name);
        if (it != target.end()) it->second.set_data(at::empty({0}, it->second.options()));
      }
      return Status::OK();
    });
  }
  return Status::OK();
}

ModuleLoad::ModuleLoad(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModuleLoad::~ModuleLoad() = default;

std::shared_future<Status> ModuleLoad::Module(std::string_view prefix) const {
  auto promise = std::make_shared<std::promise<Status>>();
  std::shared_future<Status> future = promise->get_future().share();
  Impl* impl = impl_.get();
  const Status registered = impl->load.OnModuleReady(prefix, [promise, impl](Status status) {
    // The fills ran before this (a tensor's on-tensor callback comes before its waiters).
    promise->set_value(status.ok() ? impl->FillError() : std::move(status));
  });
  if (!registered.ok()) promise->set_value(registered);
  return future;
}

LoadHandle& ModuleLoad::handle() { return impl_->load; }
const LoadPlan& ModuleLoad::plan() const { return impl_->plan; }

Result<LoadReport> ModuleLoad::Finish() {
  if (impl_->finished) {
    return Status::InvalidArgument("ModuleLoad::Finish was called before: it hands the report "
                                   "over once");
  }
  impl_->finished = true;
  const Status done = impl_->load.Done().get();
  LOADSTONE_RETURN_IF_ERROR(impl_->FillError());
  LOADSTONE_RETURN_IF_ERROR(done);
  impl_->report.placement.device_of.merge(impl_->device_of);
  return std::move(impl_->report);
}

Result<std::unique_ptr<ModuleLoad>> StartLoadInto(torch::nn::Module& model,
                                                  const std::string& path,
                                                  const TorchLoadOptions& options) {
  auto impl = std::make_unique<ModuleLoad::Impl>();
  impl->options = options;
  LOADSTONE_RETURN_IF_ERROR(impl->Start(model, path));
  return std::unique_ptr<ModuleLoad>(new ModuleLoad(std::move(impl)));
}

Result<LoadReport> LoadInto(torch::nn::Module& model, const std::string& path,
                            const TorchLoadOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(std::unique_ptr<ModuleLoad> load,
                             StartLoadInto(model, path, options));
  return load->Finish();
}

}  // namespace loadstone::libtorch
