// loadstone/asio.h: loads and per-tensor waits through each kind of completion token — a plain
// callback, a callback bound to an io_context, asio::use_future, a C++20 coroutine
// (asio::use_awaitable) — failures delivered to waiters, and cancellation through Asio's
// cancellation slot. Also LoadHandle::OnDone / OnTensorReady, which the header is built on.
#include "loadstone/asio.h"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <atomic>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "test_model.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {


constexpr const char* kTensor = "model.layers.1.attn.q.weight";

using testing::EveryChunkRead;
using testing::OneReadAtATime;
using testing::SlowReads;


TEST_CASE("asio: a plain callback gets the status and the handle, off the Loader's threads") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan& plan = model.plan;
  Loader loader;
  std::promise<std::pair<Status, size_t>> got;
  AsyncLoad(loader, ckpt, plan, [&](Status status, LoadHandle load) {
    got.set_value({std::move(status), load.Tensors().size()});
  });
  auto [status, tensors] = got.get_future().get();
  CHECK(status.ok());
  CHECK(tensors == ckpt.tensors().size());
}

TEST_CASE("asio: a handler bound to an io_context runs there, and run() waits for it") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan& plan = model.plan;
  Loader loader;
  asio::io_context io;
  std::thread::id ran_on;
  Status got = Status::Cancelled("not called");
  size_t tensors = 0;
  AsyncLoad(loader, ckpt, plan, asio::bind_executor(io, [&](Status status, LoadHandle load) {
              ran_on = std::this_thread::get_id();
              got = std::move(status);
              tensors = load.Tensors().size();
            }));
  // Nothing has been posted yet: only the operation's outstanding work keeps run() going.
  io.run();
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(got.ok());
  CHECK(tensors == ckpt.tensors().size());
}

TEST_CASE("asio: use_future, a per-tensor wait, an unknown name and an empty handle") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan& plan = model.plan;
  Loader loader;
  LoadHandle running = loader.Load(ckpt, plan);
  auto [st, tensor] = AsyncTensor(running, kTensor, asio::use_future).get();
  REQUIRE(st.ok());
  CHECK(tensor.name() == kTensor);
  testing::CheckTensorBytes(tensor);

  auto [status, load] = AsyncLoad(loader, ckpt, plan, asio::use_future).get();
  REQUIRE(status.ok());
  // After the load is done: answered at once.
  auto [again, same] = AsyncTensor(load, kTensor, asio::use_future).get();
  CHECK(again.ok());
  CHECK(same.data() == load.Tensor(kTensor).get().data());
  auto [missing, none] = AsyncTensor(load, "no.such.tensor", asio::use_future).get();
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK(none.data() == nullptr);
  LoadHandle empty;
  auto [no_load, nothing] = AsyncTensor(empty, kTensor, asio::use_future).get();
  CHECK(no_load.code() == StatusCode::kInvalidArgument);
  CHECK(std::string(no_load.message()).find("holds no load") != std::string::npos);
}

TEST_CASE("asio: a coroutine awaits one tensor while its load goes on, then a whole load") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan& plan = model.plan;
  Loader loader;
  asio::io_context io;
  bool first_ok = false, all_ok = false;
  size_t count = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        LoadHandle load = loader.Load(ckpt, plan);
        auto [st, first] = co_await AsyncTensor(load, kTensor, asio::use_awaitable);
        first_ok = st.ok() && first.name() == kTensor;
        auto [status, whole] = co_await AsyncLoad(loader, ckpt, plan, asio::use_awaitable);
        all_ok = status.ok();
        count = whole.Tensors().size();
      },
      asio::detached);
  io.run();
  CHECK(first_ok);
  CHECK(all_ok);
  CHECK(count == ckpt.tensors().size());
}

TEST_CASE("asio: a cancellation through the slot cancels the load, and the Loader goes on") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan plan = EveryChunkRead(ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  asio::io_context io;
  asio::cancellation_signal signal;
  Status got;
  Progress when_cancelled;
  AsyncLoad(loader, ckpt, plan,
            asio::bind_cancellation_slot(
                signal.slot(), asio::bind_executor(io, [&](Status status, LoadHandle load) {
                  got = std::move(status);
                  when_cancelled = load.progress();
                })));
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  CHECK(got.code() == StatusCode::kCancelled);
  CHECK(when_cancelled.tensors_done < ckpt.tensors().size());
  slow.Off();
  auto [status, load] = AsyncLoad(loader, ckpt, plan, asio::use_future).get();
  CHECK(status.ok());
}

TEST_CASE("asio: a tensor wait gets the load's failure when the load ends without it") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan plan = EveryChunkRead(ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(ckpt, plan);
  const std::string last = ckpt.tensors()[plan.tensors.back().source].name;
  auto waiting = AsyncTensor(load, last, asio::use_future);
  load.Cancel();
  auto [status, tensor] = waiting.get();
  CHECK(status.code() == StatusCode::kCancelled);
  CHECK(tensor.data() == nullptr);
  CHECK(load.Done().get().code() == StatusCode::kCancelled);
}

TEST_CASE("asio: a module wait, one that names nothing, and one the load ends without") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(model.ckpt, plan);
  auto layer = AsyncModule(load, "model.layers.1", asio::use_future);
  auto none = AsyncModule(load, "model.layers.7", asio::use_future);
  CHECK(layer.get().ok());
  CHECK(load.Tensor("model.layers.1.ids").wait_for(std::chrono::seconds(0)) ==
        std::future_status::ready);
  CHECK(none.get().code() == StatusCode::kNotFound);
  auto head = AsyncModule(load, "lm_head", asio::use_future);
  load.Cancel();
  CHECK(head.get().code() == StatusCode::kCancelled);
}

TEST_CASE("asio: OnDone and OnTensorReady from inside an on-tensor callback") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan& plan = model.plan;
  Loader loader;
  std::promise<LoadHandle*> handle;
  std::shared_future<LoadHandle*> ready = handle.get_future().share();
  std::atomic<bool> registered{false};
  std::promise<Status> done_seen;
  std::promise<std::string> tensor_seen;
  LoadOptions options;
  options.on_tensor = [&](const Tensor&) {
    if (registered.exchange(true)) return;
    LoadHandle* h = ready.get();
    REQUIRE(h->OnDone([&](Status s) { done_seen.set_value(std::move(s)); }).ok());
    REQUIRE(h->OnTensorReady(kTensor, [&](Status s, Tensor t) {
                 tensor_seen.set_value(s.ok() ? t.name() : s.ToString());
               }).ok());
  };
  LoadHandle load = loader.Load(ckpt, plan, options);
  handle.set_value(&load);
  CHECK(tensor_seen.get_future().get() == kTensor);
  CHECK(done_seen.get_future().get().ok());
  CHECK(load.Done().get().ok());
  // After the end: at once, on this thread.
  std::thread::id ran_on;
  REQUIRE(load.OnDone([&](Status) { ran_on = std::this_thread::get_id(); }).ok());
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(LoadHandle().OnDone([](Status) {}).code() == StatusCode::kInvalidArgument);
  CHECK(load.OnTensorReady("nope", [](Status, Tensor) {}).code() == StatusCode::kNotFound);
}

TEST_CASE("asio: a tensor waiter that throws fails its load with the message") {
  testing::MixedModel model;
  const Checkpoint& ckpt = model.ckpt;
  const LoadPlan plan = EveryChunkRead(ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(5));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(ckpt, plan);
  const std::string first = ckpt.tensors()[plan.tensors.front().source].name;
  REQUIRE(load.OnTensorReady(first, [](Status, Tensor) { throw std::runtime_error("boom"); }).ok());
  const Status status = load.Done().get();
  CHECK(status.code() == StatusCode::kCallbackFailed);
  CHECK(std::string(status.message()).find("boom") != std::string::npos);
}

}  // namespace
}  // namespace loadstone
