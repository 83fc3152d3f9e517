// LoadHandle's module-level waits and priorities (loader.h): Module / OnModuleReady (every tensor
// under a prefix in place), OnModules (the plan's modules in order, LoadPlan::modules) and
// Prioritize (a module's pending reads to the front of the load's queue). The waits are the
// callbacks' tensor waiters, counted down: no thread is blocked.
#include <algorithm>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "loadstone/loader.h"
#include "runtime/pipeline/load_state.h"

namespace loadstone {
namespace {

using pipeline::NoLoad;

// Tensor `name` is module `prefix` or under it ("" holds every name).
bool UnderModule(std::string_view name, std::string_view prefix) {
  if (prefix.empty() || name == prefix) return true;
  return name.size() > prefix.size() && name.starts_with(prefix) && name[prefix.size()] == '.';
}

std::shared_future<Status> Resolved(Status status) {
  std::promise<Status> done;
  done.set_value(std::move(status));
  return done.get_future().share();
}

// The planned tensors (plan indices) of module `prefix`; NotFound when there are none.
Result<std::vector<uint32_t>> MembersOf(const LoadHandle::State& state, std::string_view prefix) {
  std::vector<uint32_t> members;
  const auto& infos = state.checkpoint.tensors();
  for (uint32_t t = 0; t < state.plan.tensors.size(); ++t) {
    const size_t source = state.plan.tensors[t].source;
    if (source < infos.size() && UnderModule(infos[source].name, prefix)) members.push_back(t);
  }
  if (members.empty()) {
    return Status::NotFound(fmt::format(
        "no tensor of this load is module '{}' or under it (a module's tensors are named "
        "'{}.…')",
        prefix, prefix));
  }
  return members;
}

// Calls `callback` once: with OK when every tensor of `members` is in place, or with the first
// failure (the load's, when it ends without one of them).
void WaitAll(LoadHandle::State& state, const std::vector<uint32_t>& members,
             std::function<void(Status)> callback) {
  struct Wait {
    std::mutex mu;
    size_t left = 0;
    std::function<void(Status)> callback;  // empty once called
  };
  auto wait = std::make_shared<Wait>();
  wait->left = members.size();
  wait->callback = std::move(callback);
  for (uint32_t index : members) {
    state.callbacks.AddTensorWaiter(index, [wait](Status status, const Tensor&) {
      std::function<void(Status)> call;
      {
        std::lock_guard lock(wait->mu);
        if (!wait->callback || (status.ok() && --wait->left > 0)) return;
        call = std::move(wait->callback);
        wait->callback = nullptr;
      }
      call(std::move(status));  // outside the lock: it may wait on other tensors
    });
  }
}

}  // namespace

std::shared_future<Status> LoadHandle::Module(std::string_view prefix) const {
  auto promise = std::make_shared<std::promise<Status>>();
  std::shared_future<Status> future = promise->get_future().share();
  const Status registered =
      OnModuleReady(prefix, [promise](Status status) { promise->set_value(std::move(status)); });
  return registered.ok() ? future : Resolved(registered);
}

Status LoadHandle::OnModuleReady(std::string_view prefix,
                                 std::function<void(Status)> callback) const {
  if (!state_) return NoLoad();
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<uint32_t> members, MembersOf(*state_, prefix));
  WaitAll(*state_, members, std::move(callback));
  return Status::OK();
}

Status LoadHandle::OnModules(std::function<void(const PlanModule&, Status)> callback) const {
  if (!state_) return NoLoad();
  // Modules in place, called back in the plan's order under `mu` (so that a module known at
  // once on this thread and one landing on the callback thread never swap).
  struct InOrder {
    std::mutex mu;
    std::vector<bool> ready;
    size_t next = 0;
    bool ended = false;  // a failure was passed on
    std::function<void(const PlanModule&, Status)> callback;
    std::vector<PlanModule> modules;
  };
  auto order = std::make_shared<InOrder>();
  const std::vector<PlanModule>& modules = state_->plan.modules;
  order->modules = modules;
  order->ready.resize(modules.size());
  order->callback = std::move(callback);
  for (size_t m = 0; m < modules.size(); ++m) {
    std::vector<uint32_t> members(modules[m].end - modules[m].first);
    for (uint32_t t = modules[m].first; t < modules[m].end; ++t) members[t - modules[m].first] = t;
    WaitAll(*state_, members, [order, m](Status status) {
      std::lock_guard lock(order->mu);
      if (order->ended) return;
      if (!status.ok()) {
        order->ended = true;
        order->callback(order->modules[order->next], std::move(status));
        return;
      }
      order->ready[m] = true;
      while (order->next < order->ready.size() && order->ready[order->next]) {
        order->callback(order->modules[order->next++], Status::OK());
      }
    });
  }
  return Status::OK();
}

Status LoadHandle::Prioritize(std::string_view prefix) const {
  if (!state_) return NoLoad();
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<uint32_t> members, MembersOf(*state_, prefix));
  if (state_->finished) return Status::OK();
  const LoadPlan& plan = state_->plan;
  std::vector<bool> wanted(plan.tensors.size());
  for (uint32_t t : members) {
    wanted[t] = true;
    // The scales a quantized weight waits for come with it.
    if (UsesScales(plan.tensors[t].conversion)) wanted[plan.tensors[t].scale] = true;
  }
  std::vector<uint64_t> reads;
  for (uint64_t r = 0; r < plan.reads.size(); ++r) {
    const auto& tensors = plan.reads[r].tensors;
    if (std::any_of(tensors.begin(), tensors.end(), [&](uint32_t t) { return wanted[t]; })) {
      reads.push_back(r);
    }
  }
  state_->RequestPriority(std::move(reads));
  return Status::OK();
}

}  // namespace loadstone
