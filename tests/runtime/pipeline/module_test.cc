// LoadHandle::Module(prefix): a future that resolves when every tensor of a module is in place —
// on every kind of prefix (a tensor's own name, a block, the root, one that names nothing), when
// the load fails or is cancelled first, after the load has finished, and on an empty handle.
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test_model.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {

using testing::EveryChunkRead;
using testing::OneReadAtATime;
using testing::SlowReads;

bool Ready(const std::shared_future<Tensor>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

bool Ready(const std::shared_future<Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}


TEST_CASE("module: resolves once every tensor under it is in place, and not before") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(model.ckpt, plan);
  auto block = load.Module("model.layers.1");
  auto leaf = load.Module("model.layers.0.attn.q.weight");  // a tensor's own name
  auto root = load.Module("");
  REQUIRE(block.get().ok());
  // Every tensor of layer 1 is in place; layer 10 ("model.layers.1" is not its prefix) and the
  // head, read later one read at a time, are not yet.
  for (const char* name : {"model.layers.1.attn.q.weight", "model.layers.1.empty",
                           "model.layers.1.ids"}) {
    INFO(name);
    CHECK(Ready(load.Tensor(name)));
  }
  CHECK_FALSE(Ready(load.Tensor("model.layers.10.attn.q.weight")));
  CHECK_FALSE(Ready(load.Tensor("lm_head.weight")));
  CHECK(leaf.get().ok());
  CHECK(Ready(load.Tensor("model.layers.0.attn.q.weight")));
  REQUIRE(root.get().ok());
  for (const TensorInfo& t : model.ckpt.tensors()) {  // the root is every tensor
    INFO(t.name);
    CHECK(Ready(load.Tensor(t.name)));
  }
  CHECK(load.Done().get().ok());
  // After the load: at once.
  auto late = load.Module("model.norm");
  CHECK(Ready(late));
  CHECK(late.get().ok());
}

TEST_CASE("module: a prefix that names nothing, a partial name, an empty handle") {
  testing::MixedModel model;
  Loader loader;
  LoadHandle load = loader.Load(model.ckpt, model.plan);
  for (const char* prefix : {"model.layers.3", "model.layer", "model.layers.1.attn.q.w"}) {
    INFO(prefix);
    auto none = load.Module(prefix);
    REQUIRE(Ready(none));
    CHECK(none.get().code() == StatusCode::kNotFound);
    CHECK(none.get().message().find(prefix) != std::string::npos);
  }
  CHECK(load.Done().get().ok());
  LoadHandle empty;
  CHECK(empty.Module("model").get().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("module: the load's cancellation when it ends without the module") {
  testing::MixedModel model;
  const LoadPlan plan = EveryChunkRead(model.ckpt);
  auto slow = SlowReads(std::chrono::milliseconds(20));
  Loader loader(OneReadAtATime(slow));
  LoadHandle load = loader.Load(model.ckpt, plan);
  auto head = load.Module("lm_head");
  load.Cancel();
  CHECK(head.get().code() == StatusCode::kCancelled);
  CHECK(load.Done().get().code() == StatusCode::kCancelled);
  // The Loader goes on: the next load's module resolves.
  LoadHandle again = loader.Load(model.ckpt, plan);
  CHECK(again.Module("lm_head").get().ok());
}

}  // namespace
}  // namespace loadstone
