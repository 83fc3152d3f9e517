// Loads in Asio's completion-token style, for engines built on Asio: the same call takes a
// callback, asio::use_future or asio::use_awaitable (a C++20 coroutine).
//
//   auto [status, load] = co_await loadstone::AsyncLoad(loader, ckpt, plan, asio::use_awaitable);
//
//   loadstone::LoadHandle load = loader.Load(ckpt, plan);
//   auto [st, embed] = co_await loadstone::AsyncTensor(load, "model.embed_tokens.weight",
//                                                      asio::use_awaitable);
//
// AsyncLoad completes with void(loadstone::Status, loadstone::LoadHandle): what Done() resolves
// to, and the handle (its tensors, stats and trace). AsyncModule completes with
// void(loadstone::Status) once a module's tensors are all in place (LoadHandle::Module).
// AsyncTensor completes with
// void(loadstone::Status, loadstone::Tensor): OK and the tensor once it is in place, or why it
// never will be (the load failed or was cancelled first; NotFound for a name the load does not
// have; InvalidArgument for an empty handle).
//
// The handler runs on its associated executor, dispatched there from the load's own callback
// thread (loader.h), never on the Loader's threads, and that executor counts the operation as
// outstanding work until then (an io_context's run() does not return early). A handler bound to
// an io_context, or a coroutine, runs in that context's run(); a plain callback (the system
// executor) runs on the load's callback thread itself, like an OnDone callback — one that
// blocks delays its own load alone, and it must not wait for that load's other callbacks. A
// completion known while the operation is being started is posted, never run inside the call. A cancellation
// through the handler's cancellation slot (asio::bind_cancellation_slot, or a coroutine's own,
// e.g. under asio::experimental::awaitable_operators) cancels the load, which then completes
// with Cancelled; the slot is cleared before the handler runs. For AsyncTensor, `load` must
// outlive the operation (the cancellation cancels it).
//
// Header-only over loader.h (LoadHandle::OnDone, OnTensorReady and OnModuleReady); needs
// standalone Asio 1.22 or later where it is included. Not part of what libloadstone itself needs.
#ifndef LOADSTONE_ASIO_H_
#define LOADSTONE_ASIO_H_

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>

#include <atomic>
#include <memory>
#include <type_traits>
#include <string>
#include <utility>

#include "loadstone/loader.h"

namespace loadstone {
namespace asio_detail {

// One pending operation: the handler and a work-tracking copy of its executor, completed once.
template <typename Handler, typename... Args>
class Pending {
 public:
  explicit Pending(Handler handler)
      : handler_(std::move(handler)),
        executor_(asio::prefer(asio::get_associated_executor(handler_),
                               asio::execution::outstanding_work.tracked)) {}

  // Connects the handler's cancellation slot, if it has one, to `cancel`.
  template <typename Cancel>
  void OnCancel(Cancel cancel) {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.assign([cancel](asio::cancellation_type) { cancel(); });
  }

  // The initiating function has returned (or is about to): a completion may run inline now.
  void Started() { started_.store(true, std::memory_order_release); }

  // Dispatches the handler, with `args`, to its executor; posts it while the operation is
  // still being started.
  static void Complete(std::shared_ptr<Pending> self, Args... args) {
    auto executor = self->executor_;
    const bool started = self->started_.load(std::memory_order_acquire);
    auto call = [self = std::move(self), ... args = std::move(args)]() mutable {
      auto slot = asio::get_associated_cancellation_slot(self->handler_);
      if (slot.is_connected()) slot.clear();
      std::move(self->handler_)(std::move(args)...);
    };
    if (started) {
      asio::dispatch(executor, std::move(call));
    } else {
      asio::post(executor, std::move(call));
    }
  }

 private:
  // decay: for an executor without the property (use_future's), prefer() hands back the
  // argument itself, as a reference to a temporary.
  using Executor = std::decay_t<decltype(asio::prefer(
      std::declval<asio::associated_executor_t<Handler>>(),
      asio::execution::outstanding_work.tracked))>;
  Handler handler_;
  Executor executor_;
  std::atomic<bool> started_{false};
};

}  // namespace asio_detail

// Starts `loader.Load(checkpoint, plan, options)` and completes when it is done.
template <typename CompletionToken>
auto AsyncLoad(Loader& loader, const Checkpoint& checkpoint, const LoadPlan& plan,
               LoadOptions options, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(Status, LoadHandle)>(
      [&loader, &checkpoint, &plan, options = std::move(options)](auto handler) mutable {
        using Op = asio_detail::Pending<decltype(handler), Status, LoadHandle>;
        auto op = std::make_shared<Op>(std::move(handler));
        auto load = std::make_shared<LoadHandle>(loader.Load(checkpoint, plan, options));
        op->OnCancel([weak = std::weak_ptr<LoadHandle>(load)] {
          if (auto l = weak.lock()) l->Cancel();
        });
        // The waiter holds the handle until the load is done, then hands it to the handler.
        const Status registered = load->OnDone([op, load](Status status) mutable {
          LoadHandle handle = std::move(*load);
          load.reset();
          Op::Complete(std::move(op), std::move(status), std::move(handle));
        });
        (void)registered;  // OK: a handle that Load returned always holds a load
        op->Started();
      },
      token);
}

template <typename CompletionToken>
auto AsyncLoad(Loader& loader, const Checkpoint& checkpoint, const LoadPlan& plan,
               CompletionToken&& token) {
  return AsyncLoad(loader, checkpoint, plan, LoadOptions{},
                   std::forward<CompletionToken>(token));
}

// Completes when tensor `name` of `load` is in place, or the load ends without it.
template <typename CompletionToken>
auto AsyncTensor(LoadHandle& load, std::string name, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(Status, Tensor)>(
      [&load, name = std::move(name)](auto handler) {
        using Op = asio_detail::Pending<decltype(handler), Status, Tensor>;
        auto op = std::make_shared<Op>(std::move(handler));
        op->OnCancel([&load] { load.Cancel(); });
        const Status registered = load.OnTensorReady(name, [op](Status status, Tensor tensor) {
          Op::Complete(op, std::move(status), std::move(tensor));
        });
        if (!registered.ok()) return Op::Complete(std::move(op), registered, Tensor());
        op->Started();
      },
      token);
}

// Completes with void(loadstone::Status) once every tensor of module `prefix` is in place (OK),
// or with why it never will be (LoadHandle::OnModuleReady); as AsyncTensor otherwise.
template <typename CompletionToken>
auto AsyncModule(LoadHandle& load, std::string prefix, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(Status)>(
      [&load, prefix = std::move(prefix)](auto handler) {
        using Op = asio_detail::Pending<decltype(handler), Status>;
        auto op = std::make_shared<Op>(std::move(handler));
        op->OnCancel([&load] { load.Cancel(); });
        const Status registered = load.OnModuleReady(
            prefix, [op](Status status) { Op::Complete(op, std::move(status)); });
        if (!registered.ok()) return Op::Complete(std::move(op), registered);
        op->Started();
      },
      token);
}

}  // namespace loadstone

#endif  // LOADSTONE_ASIO_H_
