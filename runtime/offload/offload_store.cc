// OffloadStore: offloaded tensors materialised on demand, from the offload folder or read in
// place; OffloadPrefetcher: blocks of them streamed one ahead.
#include "loadstone/offload.h"

#include <chrono>
#include <future>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loadstone {

Result<std::shared_ptr<OffloadStore>> OffloadStore::Open(std::shared_ptr<Loader> loader,
                                                         const Checkpoint& checkpoint,
                                                         const LoadPlan& plan) {
  std::shared_ptr<OffloadStore> store(new OffloadStore());
  store->loader_ = std::move(loader);
  std::vector<TensorInfo> tensors;
  if (plan.offload_folder.empty()) {
    for (const OffloadPlan& o : plan.offloaded) {
      const TensorInfo& t = checkpoint.tensors()[o.source];
      store->names_.push_back(t.name);
      tensors.push_back(t);
      if (o.conversion == Conversion::kCast) store->casts_.emplace(t.name, o.dtype);
    }
    LOADSTONE_ASSIGN_OR_RETURN(Checkpoint view, checkpoint.WithTensors(std::move(tensors)));
    store->catalog_ = std::move(view);
    return store;
  }
  LOADSTONE_ASSIGN_OR_RETURN(const Checkpoint folder,
                             Checkpoint::OpenOffloadFolder(plan.offload_folder));
  for (const OffloadPlan& o : plan.offloaded) {
    const TensorInfo& t = checkpoint.tensors()[o.source];
    const TensorInfo* stored = folder.Find(t.name);
    if (stored == nullptr) {
      return Status::NotFound(fmt::format(
          "offload folder '{}' holds no tensor '{}': write it first (WriteOffload)",
          plan.offload_folder, t.name));
    }
    // A stale folder (another model, another dtype) must not pass for this plan's.
    const DType want = o.in_place ? t.dtype : o.dtype;
    if (stored->dtype != want || stored->shape != o.shape) {
      return Status::Corruption(fmt::format(
          "offload folder '{}' holds '{}' as {} {}, but this plan offloads it as {} {}: the folder "
          "is from another load; offload again (WriteOffload) or give another folder",
          plan.offload_folder, t.name, TorchName(stored->dtype), fmt::join(stored->shape, "x"),
          TorchName(want), fmt::join(o.shape, "x")));
    }
    store->names_.push_back(t.name);
    tensors.push_back(*stored);
    if (o.in_place && o.conversion == Conversion::kCast) store->casts_.emplace(t.name, o.dtype);
  }
  LOADSTONE_ASSIGN_OR_RETURN(Checkpoint view, folder.WithTensors(std::move(tensors)));
  store->catalog_ = std::move(view);
  return store;
}

OffloadStore::~OffloadStore() {
  std::lock_guard lock(mu_);
  running_.clear();  // each handle cancels and waits as it goes
}

bool OffloadStore::Contains(std::string_view name) const { return catalog_->Find(name) != nullptr; }

Result<std::string> OffloadStore::Where(std::string_view name) const {
  const TensorInfo* t = catalog_->Find(name);
  if (t == nullptr) return Status::NotFound(fmt::format("tensor '{}' is not offloaded", name));
  const std::string& path = catalog_->files()[t->file].path;
  if (path.ends_with(".dat")) return path;
  return fmt::format("{} (in place, offset {})", path, t->offset);
}

Result<LoadHandle> OffloadStore::Fetch(const std::vector<std::string>& names, const Device& device) {
  std::set<std::string_view> wanted;
  PlanOptions opt;
  for (const std::string& name : names) {
    if (!Contains(name)) return Status::NotFound(fmt::format("tensor '{}' is not offloaded", name));
    wanted.insert(name);
    if (auto c = casts_.find(name); c != casts_.end()) opt.special_dtypes.emplace(name, c->second);
  }
  DeviceMap map;
  LOADSTONE_RETURN_IF_ERROR(map.Add("", device));
  opt.explicit_map = std::move(map);
  opt.include = [&wanted](const TensorInfo& t) { return wanted.contains(t.name); };
  opt.platform = loader_->platform();
  LOADSTONE_ASSIGN_OR_RETURN(const LoadPlan plan, Plan(*catalog_, opt));
  LoadHandle handle = loader_->Load(*catalog_, plan);
  return handle;
}

std::shared_future<Tensor> OffloadStore::Materialize(std::string_view name, const Device& device) {
  Result<LoadHandle> handle = Fetch({std::string(name)}, device);
  if (!handle.ok()) {
    std::promise<Tensor> failed;
    failed.set_exception(std::make_exception_ptr(Error(handle.status())));
    return failed.get_future().share();
  }
  std::shared_future<Tensor> tensor = handle->Tensor(name);
  std::lock_guard lock(mu_);
  std::erase_if(running_, [](const LoadHandle& h) {
    return h.Done().wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  running_.push_back(std::move(*handle));
  return tensor;
}

// ---- OffloadPrefetcher ---------------------------------------------------------------------

OffloadPrefetcher::OffloadPrefetcher(std::shared_ptr<OffloadStore> store,
                                     std::vector<std::vector<std::string>> blocks, Device device)
    : store_(std::move(store)), blocks_(std::move(blocks)), device_(device), handles_(blocks_.size()) {}

void OffloadPrefetcher::Start(size_t i) {
  if (i >= blocks_.size() || handles_[i].valid()) return;
  Result<LoadHandle> handle = store_->Fetch(blocks_[i], device_);
  if (handle.ok()) handles_[i] = std::move(*handle);
  else errors_.emplace(i, handle.status());
}

Result<std::vector<Tensor>> OffloadPrefetcher::Get(size_t i) {
  if (i >= blocks_.size()) {
    return Status::InvalidArgument(fmt::format("block {} of {}: no such block", i, blocks_.size()));
  }
  Start(i);
  Start(i + 1);  // the next block streams while the caller runs this one
  if (auto e = errors_.find(i); e != errors_.end()) {
    Status failed = e->second;
    errors_.erase(e);  // a later Get(i) tries again
    return failed;
  }
  LOADSTONE_RETURN_IF_ERROR(handles_[i].Done().get());
  std::vector<Tensor> out;
  out.reserve(blocks_[i].size());
  for (const std::string& name : blocks_[i]) out.push_back(handles_[i].Tensor(name).get());
  handles_[i] = LoadHandle();  // the tensors keep their memory; the load's bookkeeping goes
  return out;
}

}  // namespace loadstone
