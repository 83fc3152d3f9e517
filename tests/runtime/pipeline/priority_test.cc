// LoadHandle::Prioritize (a module's pending reads to the front) and LoadHandle::OnModules (the
// plan's modules called back in the plan's order): on a load slowed down so that a test acts on
// it while it runs, racing its end and its cancellation, and on an empty handle.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "test_model.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {

using testing::EveryChunkRead;
using testing::OneReadAtATime;
using testing::SlowReads;

// The tensors' names in the order they land (LoadOptions::on_tensor).
struct Landed {
  std::mutex mu;
  std::vector<std::string> names;
  LoadOptions Options() {
    LoadOptions o;
    o.on_tensor = [this](const Tensor& t) {
      std::lock_guard lock(mu);
      names.emplace_back(t.name());
    };
    return o;
  }
};

// The tensors that may land before a Prioritize called at once takes effect: those of the plan's
// first `reads` reads (a load keeps twice its queue depth of reads out) and those read by none
// (empty: in place at the start).
std::set<std::string> FirstReads(const Checkpoint& ckpt, const LoadPlan& plan, size_t reads) {
  std::set<std::string> names;
  std::vector<bool> read(plan.tensors.size());
  for (size_t r = 0; r < plan.reads.size(); ++r) {
    for (uint32_t t : plan.reads[r].tensors) {
      read[t] = true;
      if (r < reads) names.insert(ckpt.tensors()[plan.tensors[t].source].name);
    }
  }
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    if (!read[t]) names.insert(ckpt.tensors()[plan.tensors[t].source].name);
  }
  return names;
}

TEST_CASE("prioritize: the head, last of the order, lands right after the reads in flight") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  REQUIRE(plan.modules.back().prefix == "lm_head");
  auto slow = SlowReads(std::chrono::milliseconds(10));
  Loader loader(OneReadAtATime(slow));
  Landed landed;
  LoadHandle load = loader.Load(model.ckpt, plan, landed.Options());
  REQUIRE(load.Prioritize("lm_head").ok());
  auto head = load.Module("lm_head");
  REQUIRE(head.get().ok());
  CHECK(load.progress().tensors_done < plan.tensors.size());  // the rest is still loading
  REQUIRE(load.Done().get().ok());
  const auto in_flight = FirstReads(model.ckpt, plan, 2);
  const auto head_at = std::find(landed.names.begin(), landed.names.end(), "lm_head.weight");
  REQUIRE(head_at != landed.names.end());
  for (auto it = landed.names.begin(); it != head_at; ++it) {
    INFO(*it << " landed before the head");
    CHECK(in_flight.count(*it) == 1);
  }
  // Without it the head lands last, as planned.
  Landed plain;
  LoadHandle again = loader.Load(model.ckpt, plan, plain.Options());
  REQUIRE(again.Done().get().ok());
  CHECK(plain.names.back() == "lm_head.weight");
}

TEST_CASE("prioritize: two calls, the later first, and after the load nothing changes") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(10));
  Loader loader(OneReadAtATime(slow));
  Landed landed;
  LoadHandle load = loader.Load(model.ckpt, plan, landed.Options());
  REQUIRE(load.Prioritize("model.layers.10").ok());
  REQUIRE(load.Prioritize("model.norm").ok());
  REQUIRE(load.Done().get().ok());
  auto at = [&](const std::string& name) {
    return std::find(landed.names.begin(), landed.names.end(), name) - landed.names.begin();
  };
  CHECK(at("model.norm.weight") < at("model.layers.10.attn.q.weight"));
  CHECK(at("model.layers.10.attn.q.weight") < at("model.layers.1.attn.q.weight"));
  CHECK(landed.names.size() == plan.tensors.size());
  // After the load: OK, and nothing happens.
  CHECK(load.Prioritize("model.norm").ok());
}

TEST_CASE("prioritize: a prefix that names nothing, an empty handle") {
  testing::MixedModel model;
  Loader loader;
  LoadHandle load = loader.Load(model.ckpt, model.plan);
  const Status none = load.Prioritize("model.layers.3");
  CHECK(none.code() == StatusCode::kNotFound);
  CHECK(none.message().find("'model.layers.3'") != std::string::npos);
  CHECK(load.Done().get().ok());
  LoadHandle empty;
  CHECK(empty.Prioritize("model").code() == StatusCode::kInvalidArgument);
}

TEST_CASE("prioritize: racing the load's end and its cancellation, the Loader goes on") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  Loader loader;
  for (int round = 0; round < 20; ++round) {
    LoadHandle load = loader.Load(model.ckpt, plan);
    std::atomic<bool> stop{false};
    std::atomic<int> refused{0};  // counted here, checked below: Catch is not thread-safe
    std::thread prioritizer([&] {
      for (int i = 0; !stop.load() && i < 200; ++i) {
        const PlanModule& m = plan.modules[plan.modules.size() - 1 - i % plan.modules.size()];
        if (!load.Prioritize(m.prefix).ok()) ++refused;
      }
    });
    if (round % 2 == 1) {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
      load.Cancel();
    }
    const Status done = load.Done().get();
    stop = true;
    prioritizer.join();
    CHECK(refused == 0);
    INFO("round " << round << ": " << done.ToString());
    CHECK((done.ok() || done.code() == StatusCode::kCancelled));
    if (done.ok()) {
      for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
    }
  }
  LoadHandle last = loader.Load(model.ckpt, plan);
  REQUIRE(last.Done().get().ok());
  for (const Tensor& t : last.Tensors()) testing::CheckTensorBytes(t);
}

TEST_CASE("on modules: each module once, in the plan's order, with all before it in place") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(2));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(model.ckpt, plan);
  // Completions out of plan order (the head first) must not change the callbacks' order.
  REQUIRE(load.Prioritize("lm_head").ok());
  // Written on the load's callback thread, read once Done() has resolved (after them): no
  // Catch assertion in the callback, Catch is not thread-safe.
  std::vector<std::string> called;
  bool all_before_ready = true, all_ok = true;
  REQUIRE(load.OnModules([&](const PlanModule& m, Status s) {
                all_ok = all_ok && s.ok();
                called.push_back(m.prefix);
                for (uint32_t t = 0; t < m.end; ++t) {
                  const auto f = load.Tensor(model.ckpt.tensors()[plan.tensors[t].source].name);
                  all_before_ready = all_before_ready &&
                                     f.wait_for(std::chrono::seconds(0)) ==
                                         std::future_status::ready;
                }
              })
              .ok());
  REQUIRE(load.Done().get().ok());
  std::vector<std::string> expected;
  for (const PlanModule& m : plan.modules) expected.push_back(m.prefix);
  CHECK(called == expected);
  CHECK(all_ok);
  CHECK(all_before_ready);
  // After the load: every module at once, in order, on this thread.
  std::vector<std::string> late;
  REQUIRE(load.OnModules([&](const PlanModule& m, Status) { late.push_back(m.prefix); }).ok());
  CHECK(late == expected);
  CHECK(LoadHandle().OnModules([](const PlanModule&, Status) {}).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("on modules: a cancelled load calls back once, with Cancelled, for the first module "
          "not in place") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(model.ckpt, plan);
  std::mutex mu;
  std::vector<std::pair<std::string, StatusCode>> called;
  REQUIRE(load.OnModules([&](const PlanModule& m, Status s) {
                std::lock_guard lock(mu);
                called.emplace_back(m.prefix, s.code());
              })
              .ok());
  REQUIRE(load.Module("model.layers.0").get().ok());
  load.Cancel();
  CHECK(load.Done().get().code() == StatusCode::kCancelled);
  std::lock_guard lock(mu);
  REQUIRE(!called.empty());
  CHECK(called.back().second == StatusCode::kCancelled);
  for (size_t i = 0; i + 1 < called.size(); ++i) {
    CHECK(called[i].first == plan.modules[i].prefix);
    CHECK(called[i].second == StatusCode::kOk);
  }
  CHECK(called.back().first == plan.modules[called.size() - 1].prefix);
}

}  // namespace
}  // namespace loadstone
