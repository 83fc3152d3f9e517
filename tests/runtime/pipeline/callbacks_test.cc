// One load's callbacks never delay another load: loads whose callbacks block (on_tensor, an
// OnDone, an Asio completion), however many, and callbacks that wait for another load's Done(),
// leave every other load on the same Loader to finish and call back. Every wait is bounded, so
// that a broken isolation fails the test instead of hanging it.
#include "loadstone/asio.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "loadstone/loader.h"
#include "tests/runtime/pipeline/callback_test_util.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {

using testing::Gate;
using testing::kBound;
using testing::Resolves;

constexpr auto kHang = std::chrono::seconds(120);  // a test still running then has hung

TEST_CASE("callbacks: 1 to 8 loads blocked in on_tensor delay neither a plain load nor a quick one") {
  const testing::Watchdog watchdog(Catch::getResultCapture().getCurrentTestName(), kHang);
  testing::SmallModel model;
  Loader loader;
  for (int blocked = 1; blocked <= 8; ++blocked) {
    INFO(blocked << " loads blocked in their on_tensor callback");
    auto gate = std::make_shared<Gate>();
    std::atomic<int> inside{0};
    LoadOptions blocking;
    blocking.on_tensor = [gate, &inside](const Tensor&) {
      ++inside;
      gate->Wait();
    };
    std::atomic<size_t> quick_calls{0};
    LoadOptions quick;
    quick.on_tensor = [&quick_calls](const Tensor&) { ++quick_calls; };
    std::vector<LoadHandle> stuck;
    LoadHandle plain, with_quick;
    const testing::OpenOnExit opener(gate);  // before the handles wait for their loads
    for (int i = 0; i < blocked; ++i) stuck.push_back(loader.Load(model.ckpt, model.plan, blocking));
    // Each blocked load is inside its callback, holding whatever thread runs it.
    REQUIRE(testing::Eventually([&] { return inside.load() == blocked; }));

    plain = loader.Load(model.ckpt, model.plan);
    with_quick = loader.Load(model.ckpt, model.plan, quick);

    REQUIRE(Resolves(plain.Done()));
    CHECK(plain.Done().get().ok());
    REQUIRE(Resolves(with_quick.Done()));
    CHECK(with_quick.Done().get().ok());
    CHECK(quick_calls.load() == model.ckpt.tensors().size());
    for (const LoadHandle& h : stuck) {
      CHECK(h.Done().wait_for(std::chrono::seconds(0)) != std::future_status::ready);
    }
    gate->Open();
    for (const LoadHandle& h : stuck) {
      REQUIRE(Resolves(h.Done()));
      CHECK(h.Done().get().ok());
    }
  }
}

TEST_CASE("callbacks: callbacks that wait for another load's Done() see it resolve") {
  const testing::Watchdog watchdog(Catch::getResultCapture().getCurrentTestName(), kHang);
  testing::SmallModel model;
  Loader loader;
  constexpr int kWaiting = 4;
  std::promise<std::shared_future<Status>> target_promise;
  std::shared_future<std::shared_future<Status>> target = target_promise.get_future().share();
  std::atomic<int> saw_it{0}, timed_out{0};
  LoadOptions waiting;
  waiting.on_tensor = [&](const Tensor&) {
    const std::shared_future<Status> done = target.get();
    if (done.wait_for(kBound) == std::future_status::ready && done.get().ok()) {
      ++saw_it;
    } else {
      ++timed_out;
    }
  };
  std::vector<LoadHandle> waiters;
  for (int i = 0; i < kWaiting; ++i) waiters.push_back(loader.Load(model.ckpt, model.plan, waiting));
  LoadHandle other = loader.Load(model.ckpt, model.plan);
  target_promise.set_value(other.Done());
  REQUIRE(Resolves(other.Done()));
  for (const LoadHandle& h : waiters) {
    REQUIRE(Resolves(h.Done()));
    CHECK(h.Done().get().ok());
  }
  CHECK(timed_out.load() == 0);
  CHECK(saw_it.load() == static_cast<int>(kWaiting * model.ckpt.tensors().size()));
}

TEST_CASE("callbacks: blocked OnDone callbacks delay no other load's OnDone") {
  const testing::Watchdog watchdog(Catch::getResultCapture().getCurrentTestName(), kHang);
  testing::SmallModel model;
  Loader loader;
  auto gate = std::make_shared<Gate>();
  std::atomic<int> inside{0};
  std::vector<LoadHandle> stuck;
  LoadHandle free_one;
  std::promise<Status> called;
  const testing::OpenOnExit opener(gate);
  // Holds each load open until its OnDone is registered: on a load already finished, OnDone
  // runs the callback at once on this thread, which the gate would then block.
  auto registered = std::make_shared<Gate>();
  const testing::OpenOnExit open_registered(registered);
  LoadOptions held;
  held.on_tensor = [registered](const Tensor&) { registered->Wait(); };
  for (int i = 0; i < 8; ++i) {
    stuck.push_back(loader.Load(model.ckpt, model.plan, held));
    REQUIRE(stuck.back().OnDone([gate, &inside](Status) {
                         ++inside;
                         gate->Wait();
                       }).ok());
  }
  registered->Open();
  REQUIRE(testing::Eventually([&] { return inside.load() == 8; }));
  free_one = loader.Load(model.ckpt, model.plan);
  REQUIRE(free_one.OnDone([&](Status s) { called.set_value(std::move(s)); }).ok());
  auto got = called.get_future();
  REQUIRE(got.wait_for(kBound) == std::future_status::ready);
  CHECK(got.get().ok());
}

TEST_CASE("callbacks: blocked Asio completions delay neither a co_await nor another completion") {
  const testing::Watchdog watchdog(Catch::getResultCapture().getCurrentTestName(), kHang);
  testing::SmallModel model;
  Loader loader;
  std::atomic<int> inside{0}, released{0};
  auto gate = std::make_shared<Gate>();
  const testing::OpenOnExit opener(gate);
  // Plain handlers that block: more than the system executor's threads on any machine here.
  const int blocked = static_cast<int>(std::max(8u, 2 * std::thread::hardware_concurrency() + 1));
  for (int i = 0; i < blocked; ++i) {
    AsyncLoad(loader, model.ckpt, model.plan, [gate, &inside, &released](Status, LoadHandle) {
      ++inside;
      gate->Wait();
      ++released;
    });
  }
  REQUIRE(testing::Eventually([&] { return inside.load() == blocked; }));

  std::promise<Status> plain;
  AsyncLoad(loader, model.ckpt, model.plan,
            [&plain](Status s, LoadHandle) { plain.set_value(std::move(s)); });
  auto plain_done = plain.get_future();
  REQUIRE(plain_done.wait_for(kBound) == std::future_status::ready);
  CHECK(plain_done.get().ok());

  asio::io_context io;
  std::atomic<bool> awaited{false};
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto [status, load] = co_await AsyncLoad(loader, model.ckpt, model.plan, asio::use_awaitable);
        awaited = status.ok() && load.Tensors().size() == model.ckpt.tensors().size();
      },
      asio::detached);
  std::thread runner([&io] { io.run_for(kBound); });
  runner.join();
  CHECK(awaited.load());
  gate->Open();
  CHECK(testing::Eventually([&] { return released.load() == blocked; }));
}

// A plan whose six tensors are six reads (no coalescing, no page-cache copies): with slow reads,
// the load is still running after its first tensor.
LoadPlan ReadOneByOne(const Checkpoint& ckpt) {
  PlanOptions po;
  po.coalesce_below = 0;
  po.routes.fill_fresh_pages = false;
  return testing::MixedModel::PlanOf(ckpt, po);
}

TEST_CASE("callbacks: a handle destroyed inside its own on_tensor callback, then ~Loader returns") {
  const testing::Watchdog watchdog("a handle destroyed in its own on_tensor", kHang);
  testing::SmallModel model;
  const bool running = GENERATE(false, true);  // the load still reading when its handle goes
  INFO((running ? "slow reads: the load is still running" : "the load may have finished"));
  auto slow = testing::SlowReads(std::chrono::milliseconds(running ? 50 : 0));
  const LoadPlan plan = running ? ReadOneByOne(model.ckpt) : model.plan;
  auto sentinel = std::make_shared<int>(0);  // held by the callback, so by the load
  const std::weak_ptr<int> load_alive = sentinel;
  std::atomic<int> called_after{0};
  std::shared_future<Status> done;
  {
    Loader loader(testing::OneReadAtATime(slow));
    std::optional<LoadHandle> load;
    std::promise<void> assigned, destroyed;
    std::shared_future<void> ready = assigned.get_future().share();
    std::atomic<bool> gone{false};
    LoadOptions options;
    options.on_tensor = [&, sentinel = std::move(sentinel)](const Tensor&) {
      ready.wait();
      if (gone.exchange(true)) {
        ++called_after;
        return;
      }
      load.reset();  // from its own callback thread: must not wait for itself
      destroyed.set_value();
    };
    load.emplace(loader.Load(model.ckpt, plan, options));
    done = load->Done();
    assigned.set_value();
    REQUIRE(destroyed.get_future().wait_for(kBound) == std::future_status::ready);
    REQUIRE(Resolves(done));
  }  // ~Loader
  if (running) CHECK(done.get().code() == StatusCode::kCancelled);
  CHECK(called_after.load() == 0);  // no on-tensor callback once its handle was gone
  CHECK(load_alive.expired());      // freed by the time ~Loader returned
}

TEST_CASE("callbacks: a handle destroyed inside its own OnDone callback, then ~Loader returns") {
  const testing::Watchdog watchdog("a handle destroyed in its own OnDone", kHang);
  testing::SmallModel model;
  auto sentinel = std::make_shared<int>(0);
  const std::weak_ptr<int> load_alive = sentinel;
  Status got = Status::Cancelled("not called");
  bool on_main_thread = true;
  {
    Loader loader;
    auto gate = std::make_shared<Gate>();
    LoadOptions options;
    // Holds the load open until OnDone is registered, so that OnDone runs on the callback thread.
    options.on_tensor = [gate, sentinel = std::move(sentinel)](const Tensor&) { gate->Wait(); };
    std::optional<LoadHandle> load(loader.Load(model.ckpt, model.plan, options));
    std::promise<void> destroyed;
    const std::thread::id main = std::this_thread::get_id();
    REQUIRE(load->OnDone([&](Status s) {
                   got = std::move(s);
                   on_main_thread = std::this_thread::get_id() == main;
                   load.reset();
                   destroyed.set_value();
                 }).ok());
    gate->Open();
    REQUIRE(destroyed.get_future().wait_for(kBound) == std::future_status::ready);
  }  // ~Loader
  CHECK(got.ok());
  CHECK_FALSE(on_main_thread);
  CHECK(load_alive.expired());
}

TEST_CASE("callbacks: CancelAll cancels every running load and the Loader goes on") {
  const testing::Watchdog watchdog("CancelAll", kHang);
  testing::SmallModel model;
  const LoadPlan plan = ReadOneByOne(model.ckpt);
  auto slow = testing::SlowReads(std::chrono::milliseconds(50));
  Loader loader(testing::OneReadAtATime(slow));
  loader.CancelAll();  // nothing running: nothing happens
  std::atomic<size_t> calls{0};
  LoadOptions counted;
  counted.on_tensor = [&calls](const Tensor&) { ++calls; };
  std::vector<LoadHandle> loads;
  for (int i = 0; i < 3; ++i) loads.push_back(loader.Load(model.ckpt, plan, i == 0 ? counted : LoadOptions{}));
  loader.CancelAll();
  for (const LoadHandle& h : loads) {
    REQUIRE(Resolves(h.Done()));
    CHECK(h.Done().get().code() == StatusCode::kCancelled);
  }
  CHECK(calls.load() < model.ckpt.tensors().size());

  // From inside a callback: its own load and the others.
  LoadOptions cancels;
  std::atomic<bool> once{false};
  cancels.on_tensor = [&](const Tensor&) {
    if (!once.exchange(true)) loader.CancelAll();
  };
  LoadHandle other = loader.Load(model.ckpt, plan);
  LoadHandle self = loader.Load(model.ckpt, plan, cancels);
  REQUIRE(Resolves(self.Done()));
  CHECK(self.Done().get().code() == StatusCode::kCancelled);
  REQUIRE(Resolves(other.Done()));
  CHECK(other.Done().get().code() == StatusCode::kCancelled);

  slow.Off();
  LoadHandle after = loader.Load(model.ckpt, model.plan, counted);
  REQUIRE(Resolves(after.Done()));
  CHECK(after.Done().get().ok());
  CHECK(after.Tensors().size() == model.ckpt.tensors().size());
}

}  // namespace
}  // namespace loadstone
