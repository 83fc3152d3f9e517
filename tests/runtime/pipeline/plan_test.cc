// Plan(): ordering, the dtype policy, keep_in_fp32, chunking and coalescing — without I/O.
#include "loadstone/plan.h"

#include <set>

#include <catch2/catch.hpp>

#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

std::vector<std::string> Names(const Checkpoint& ckpt, const LoadPlan& plan) {
  std::vector<std::string> names;
  for (const TensorPlan& t : plan.tensors) names.push_back(ckpt.tensors()[t.source].name);
  return names;
}

TEST_CASE("plan: tensors come in shard order, then natural name order") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);  // one file
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  auto names = Names(ckpt, *plan);
  auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  CHECK(pos("model.layers.2.fp8.weight") < pos("model.layers.10.attn.q.weight"));
  CHECK(pos("model.layers.0.attn.q.bias") < pos("model.layers.1.attn.q.weight"));
  CHECK(pos("lm_head.weight") < pos("model.embed_tokens.weight"));  // names, not module order
}

TEST_CASE("plan: every byte is read exactly once, chunks bounded by max_chunk") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions options;
  options.max_chunk = 1 << 20;
  auto plan = Plan(ckpt, options);
  REQUIRE(plan.ok());
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  for (const ReadChunk& r : plan->reads) {
    CHECK(r.length <= options.max_chunk);
    CHECK(r.length > 0);
    ranges[r.file].push_back({r.offset, r.offset + r.length});
    if (!r.staged) CHECK(r.tensors.size() == 1);
  }
  uint64_t covered = 0;
  for (auto& [file, rs] : ranges) {
    std::sort(rs.begin(), rs.end());
    for (size_t i = 1; i < rs.size(); ++i) CHECK(rs[i - 1].second <= rs[i].first);
    for (auto& [a, b] : rs) covered += b - a;
  }
  CHECK(covered == ckpt.total_bytes());
  CHECK(plan->read_bytes == ckpt.total_bytes());
}

TEST_CASE("plan: small neighbours are coalesced into one staged read") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  size_t multi = 0;
  for (const ReadChunk& r : plan->reads) multi += r.tensors.size() > 1;
  CHECK(multi > 0);
}

TEST_CASE("plan: --dtype casts floats, never integers or bool; keep_in_fp32 is anchored") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions options;
  options.dtype = DType::kBF16;
  options.keep_in_fp32 = {"norm"};
  auto plan = Plan(ckpt, options);
  REQUIRE(plan.ok());
  for (const TensorPlan& t : plan->tensors) {
    const TensorInfo& src = ckpt.tensors()[t.source];
    INFO(src.name);
    if (!IsFloatingPoint(src.dtype)) {
      CHECK(t.dtype == src.dtype);
      CHECK(t.conversion == Conversion::kNone);
    } else if (src.name == "model.norm.weight" || src.name == "model.layers.0.norm.weight") {
      CHECK(t.dtype == DType::kF32);
    } else {
      CHECK(t.dtype == DType::kBF16);
    }
    CHECK(t.nbytes == src.numel() * DTypeBits(t.dtype) / 8);
  }
}

TEST_CASE("plan: device maps route tensors; GPU tensors are always staged") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions one;
  one.device_map = "cuda:1";
  auto all_on_one = Plan(ckpt, one);
  REQUIRE(all_on_one.ok());
  for (const TensorPlan& t : all_on_one->tensors) CHECK(t.device == "cuda:1");
  for (const ReadChunk& r : all_on_one->reads) CHECK(r.staged);
  CHECK(all_on_one->device_map.ToJson() == R"({"": 1})");

  PlanOptions balanced;
  balanced.device_map = "sequential";
  balanced.max_memory = MaxMemory{{"0", std::string("28MB")}, {"1", std::string("6MB")},
                                  {"cpu", std::string("1GB")}};
  auto split = Plan(ckpt, balanced);
  REQUIRE(split.ok());
  std::set<std::string> used;
  for (const TensorPlan& t : split->tensors) used.insert(t.device);
  CHECK(used.count("cuda:0") == 1);
  CHECK(used.size() >= 2);
  for (const TensorPlan& t : split->tensors) {
    CHECK(split->device_map.Lookup(ckpt.tensors()[t.source].name)->ToString() == t.device);
  }
}

TEST_CASE("plan: bad options are refused") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions disk;
  disk.device_map = "sequential";
  disk.max_memory = MaxMemory{{"cpu", int64_t{1000}}};
  auto offloaded = Plan(ckpt, disk);
  CHECK(offloaded.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(offloaded.status().message()), Catch::Contains("disk"));
  PlanOptions bad;
  bad.device_map = "gpu7";
  CHECK(Plan(ckpt, bad).status().code() == StatusCode::kInvalidArgument);
  PlanOptions int_target;
  int_target.dtype = DType::kI32;
  CHECK(Plan(ckpt, int_target).status().code() == StatusCode::kInvalidArgument);
  PlanOptions odd_chunk;
  odd_chunk.max_chunk = 1000;
  CHECK(Plan(ckpt, odd_chunk).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loadstone
