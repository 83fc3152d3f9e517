#include "loadstone/loader.h"

#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "runtime/device/platform_impl.h"
#include "runtime/pipeline/load_state.h"

namespace loadstone {

namespace {

// The name, shape and device of a Tensor made from values.
struct OwnNames {
  std::string name;
  std::vector<uint64_t> shape;
  std::string device;
};

}  // namespace

Tensor::Tensor(std::string name, DType dtype, std::vector<uint64_t> shape, std::string device,
               std::shared_ptr<void> owner, std::byte* data, uint64_t nbytes)
    : dtype_(dtype), owner_(std::move(owner)), data_(data), nbytes_(nbytes) {
  auto names = std::make_shared<const OwnNames>(
      OwnNames{std::move(name), std::move(shape), std::move(device)});
  name_ = &names->name;
  shape_ = &names->shape;
  device_ = &names->device;
  names_owner_ = std::move(names);
}

Status Tensor::CopyToHost(std::span<std::byte> dst) const {
  if (dst.size() != nbytes_) {
    return Status::InvalidArgument(fmt::format("tensor '{}' has {} bytes, the buffer {}", *name_,
                                               nbytes_, dst.size()));
  }
  if (copier_) return (*copier_)(dst);
  if (nbytes_) std::memcpy(dst.data(), data_, nbytes_);
  return Status::OK();
}

struct Loader::Impl {
  explicit Impl(const LoaderOptions& opts)
      : options(opts),
        platform(PlatformAccess::Get(device::OrDefault(options.platform))),
        devices(platform.open_devices(&device_log)),
        workers(opts.worker_threads > 0 ? opts.worker_threads
                                        : std::max(1u, std::thread::hardware_concurrency())),
        guard(asio::make_work_guard(loop)),
        thread([this] { loop.run(); }) {}

  ~Impl() {
    const std::vector<std::shared_ptr<LoadHandle::State>> running = Running();
    for (const auto& state : running) state->RequestCancel();
    // Each load's callback thread lets go of it too (a handle destroyed in its own callback
    // leaves the load to that thread): a load nobody else holds is freed here.
    for (const auto& state : running) {
      state->done.wait();
      state->callbacks.WaitEnded();
    }
    guard.reset();
    loop.stop();
    thread.join();
    workers.join();
  }

  // The loads not yet freed.
  std::vector<std::shared_ptr<LoadHandle::State>> Running() {
    std::vector<std::shared_ptr<LoadHandle::State>> running;
    std::lock_guard lock(mu);
    for (auto& weak : loads) {
      if (auto state = weak.lock()) running.push_back(std::move(state));
    }
    return running;
  }

  const LoaderOptions options;
  const Platform::Impl& platform;  // kept alive by options.platform or Platform::Default()
  std::string device_log;      // why there are (no) devices
  device::DeviceSet devices;   // "cuda:N" = devices[N]
  asio::io_context loop;
  asio::thread_pool workers;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  std::mutex mu;
  std::list<std::weak_ptr<LoadHandle::State>> loads;  // guarded by mu
  std::thread thread;
};

Loader::Loader(const LoaderOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Loader::~Loader() = default;

const LoadHooks* LoaderAccess::Hooks(const Loader& loader) {
  return loader.impl_->options.hooks.get();
}

std::shared_ptr<const Platform> Loader::platform() const {
  return impl_->options.platform ? impl_->options.platform : Platform::Default();
}

LoadHandle Loader::Load(const Checkpoint& checkpoint, const LoadPlan& plan,
                        const LoadOptions& options) {
  auto state = std::make_shared<LoadHandle::State>(impl_->loop, impl_->workers, checkpoint, plan,
                                                   options, impl_->options,
                                                   impl_->devices,
                                                   impl_->device_log);
  {
    std::lock_guard lock(impl_->mu);
    impl_->loads.remove_if([](const auto& weak) { return weak.expired(); });
    impl_->loads.push_back(state);
  }
  asio::post(impl_->loop, [state] { state->Start(); });
  return LoadHandle(state);
}

void Loader::CancelAll() {
  for (const auto& state : impl_->Running()) {
    if (!state->ended()) state->RequestCancel();
  }
}

LoadHandle::LoadHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
LoadHandle::LoadHandle(LoadHandle&&) noexcept = default;

LoadHandle& LoadHandle::operator=(LoadHandle&& other) noexcept {
  if (this != &other) {
    LoadHandle old(std::move(*this));
    state_ = std::move(other.state_);
  }
  return *this;
}

Status pipeline::NoLoad() {
  return Status::InvalidArgument(
      "this LoadHandle holds no load (default-constructed or moved from); use the handle "
      "Loader::Load returned");
}

using pipeline::NoLoad;

LoadHandle::~LoadHandle() {
  if (!state_) return;
  if (!state_->ended()) state_->RequestCancel();
  if (state_->callbacks.OnItsThread()) {
    // From one of its own callbacks, which the load's end waits for: waiting here would wait for
    // itself. The load ends (cancelled, if it had not finished) and is freed by that thread.
    state_->callbacks.Abandon();
    return;
  }
  state_->done.wait();  // resolved after the load's last callback
  state_->callbacks.WaitEnded();  // its OnDone callbacks too: its callback thread lets go
  // The event loop and the workers may still hold the load for the instant after it finished:
  // wait (on a signal, not a poll) until they have let go, so that its memory is freed when this
  // destructor returns.
  std::future<void> released = state_->released.promise->get_future();
  state_.reset();
  released.wait();
}

bool LoadHandle::valid() const { return state_ != nullptr; }

std::shared_future<Status> LoadHandle::Done() const {
  if (state_) return state_->done;
  std::promise<Status> none;
  none.set_value(NoLoad());
  return none.get_future().share();
}

std::shared_future<Tensor> LoadHandle::Tensor(std::string_view name) const {
  auto failed = [](Status status) {
    std::promise<loadstone::Tensor> missing;
    missing.set_exception(std::make_exception_ptr(Error(std::move(status))));
    return missing.get_future().share();
  };
  if (!state_) return failed(NoLoad());
  const std::optional<uint32_t> index = state_->tensors.IndexOf(name);
  if (!index) return failed(Status::NotFound(fmt::format("no tensor '{}' in this load", name)));
  return state_->tensors.future(*index);
}

Status LoadHandle::OnTensor(std::function<void(const loadstone::Tensor&)> callback) {
  if (!state_) return NoLoad();
  state_->callbacks.Add(std::move(callback));
  return Status::OK();
}

Status LoadHandle::OnDone(std::function<void(Status)> callback) {
  if (!state_) return NoLoad();
  state_->callbacks.AddDoneWaiter(std::move(callback));
  return Status::OK();
}

Status LoadHandle::OnTensorReady(std::string_view name,
                                 std::function<void(Status, loadstone::Tensor)> callback) {
  if (!state_) return NoLoad();
  const std::optional<uint32_t> index = state_->tensors.IndexOf(name);
  if (!index) return Status::NotFound(fmt::format("no tensor '{}' in this load", name));
  state_->callbacks.AddTensorWaiter(*index, std::move(callback));
  return Status::OK();
}

std::vector<Tensor> LoadHandle::Tensors() const {
  std::vector<loadstone::Tensor> out;
  if (!state_ || state_->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready ||
      !state_->done.get().ok()) {
    return out;
  }
  out.reserve(state_->tensors.size());
  for (uint32_t t = 0; t < state_->tensors.size(); ++t) {
    out.push_back(state_->tensors.future(t).get());
  }
  return out;
}

Progress LoadHandle::progress() const { return state_ ? state_->Snapshot() : Progress{}; }

std::string LoadHandle::backend() const {
  if (!state_) return "no load";
  state_->started.wait();  // the reader is open and the description final
  std::lock_guard lock(state_->callbacks_mu);
  return state_->backend_description;
}

ReadStats LoadHandle::read_stats() const {
  if (!state_) return {};
  std::lock_guard lock(state_->callbacks_mu);
  return state_->read_stats;
}

Status LoadHandle::late_callback_error() const {
  return state_ ? state_->callbacks.LateFailure() : Status::OK();
}

void LoadHandle::Cancel() {
  if (state_ && !state_->ended()) state_->RequestCancel();
}

Status LoadHandle::WriteTrace(const std::string& path) const {
  if (!state_) return NoLoad();
  return state_->trace.WriteJson(path);
}

}  // namespace loadstone
