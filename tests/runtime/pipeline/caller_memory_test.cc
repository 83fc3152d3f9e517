// PlanOptions::caller_memory + LoadOptions::destination: tensors read into memory the caller
// already has (a model's allocated parameters), warm straight from the page cache, cold through
// staging, nothing of loadstone's allocated for them; a missing or wrong-sized destination fails
// the load naming the tensor.
#include <map>

#include <catch2/catch.hpp>

#include "tests/runtime/pipeline/test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

struct Buffers {
  std::map<std::string, std::vector<std::byte>> by_name;
  LoadOptions Options() {
    LoadOptions o;
    o.destination = [this](const TensorInfo& t, const TensorPlan& tp) {
      auto& b = by_name[t.name];
      b.assign(tp.nbytes, std::byte{0xEE});
      return std::span<std::byte>(b);
    };
    return o;
  }
};

}  // namespace

TEST_CASE("caller memory: tensors land in the caller's buffers, warm and cold", "[pipeline]") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions opt;
  opt.caller_memory = [](const TensorInfo&) { return true; };
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  for (const TensorPlan& t : plan->tensors) {
    CHECK(t.caller_memory);
    CHECK_FALSE(t.fresh_pages);
  }
  for (const ReadChunk& r : plan->reads) CHECK_FALSE(r.shared_buffer);
  Loader loader;
  for (const bool cold : {false, true}) {
    INFO((cold ? "cold" : "warm"));
    if (cold) {
      for (const CheckpointFile& f : ckpt.files()) REQUIRE(testing::DropFromPageCache(f.path));
    }
    Buffers buffers;
    LoadHandle load = loader.Load(ckpt, *plan, buffers.Options());
    REQUIRE(load.Done().get().ok());
    REQUIRE(buffers.by_name.size() == ckpt.tensors().size());
    for (const Tensor& t : load.Tensors()) {
      INFO(t.name());
      const auto& b = buffers.by_name.at(t.name());
      CHECK(t.data() == b.data());  // the caller's memory, not a copy
      testing::CheckTensorBytes(t);
    }
    // Warm, the workers copy every read that is not staged out of the page cache (streaming
    // stores, io/mapped_copy.h); cold, none (the bytes are not there to copy).
    const ReadStats rs = load.read_stats();
    INFO("backend: " << load.backend());
    if (cold) {
      CHECK(rs.taken(ReadRoute::kPageCacheCopy).reads == 0);
    } else {
      CHECK(rs.taken(ReadRoute::kPageCacheCopy).bytes > 0);
      CHECK(rs.taken(ReadRoute::kInPlace).reads == 0);
    }
  }
}

TEST_CASE("caller memory: only the chosen CPU tensors, others as usual", "[pipeline]") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions opt;
  const std::string chosen = ckpt.tensors().front().name;
  opt.caller_memory = [&](const TensorInfo& t) { return t.name == chosen; };
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  Buffers buffers;
  LoadHandle load = loader.Load(ckpt, *plan, buffers.Options());
  REQUIRE(load.Done().get().ok());
  CHECK(buffers.by_name.size() == 1);
  CHECK(load.Tensor(chosen).get().data() == buffers.by_name.at(chosen).data());
  for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
}

TEST_CASE("caller memory: no destination, or one of the wrong size, fails naming the tensor",
          "[pipeline]") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions opt;
  opt.caller_memory = [](const TensorInfo&) { return true; };
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  Status none = loader.Load(ckpt, *plan).Done().get();
  CHECK(none.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(none.message()), Catch::Contains("LoadOptions::destination"));
  LoadOptions wrong;
  std::vector<std::byte> small(1);
  wrong.destination = [&](const TensorInfo&, const TensorPlan&) { return std::span<std::byte>(small); };
  Status sized = loader.Load(ckpt, *plan, wrong).Done().get();
  CHECK(sized.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(sized.message()), Catch::Contains("gave 1 bytes for tensor"));
  LoadOptions throws;
  throws.destination = [](const TensorInfo&, const TensorPlan&) -> std::span<std::byte> {
    throw std::runtime_error("no memory for you");
  };
  Status thrown = loader.Load(ckpt, *plan, throws).Done().get();
  CHECK(thrown.code() == StatusCode::kCallbackFailed);
  CHECK_THAT(std::string(thrown.message()), Catch::Contains("threw for tensor") &&
                                                Catch::Contains("no memory for you"));
  // The Loader is fine afterwards.
  Buffers buffers;
  REQUIRE(loader.Load(ckpt, *plan, buffers.Options()).Done().get().ok());
}

}  // namespace loadstone
