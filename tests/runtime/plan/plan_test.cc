// Plan(): ordering, the dtype policy, keep_in_fp32, chunking and coalescing — without I/O.
#include "loadstone/plan.h"

#include <map>
#include <set>

#include <catch2/catch.hpp>

#include "tests/runtime/pipeline/test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

std::vector<std::string> Names(const Checkpoint& ckpt, const LoadPlan& plan) {
  std::vector<std::string> names;
  for (const TensorPlan& t : plan.tensors) names.push_back(ckpt.tensors()[t.source].name);
  return names;
}

TEST_CASE("plan: tensors come in execution order: embeddings, layers by number, head last") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);  // one file
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  auto names = Names(ckpt, *plan);
  auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  CHECK(pos("model.layers.2.fp8.weight") < pos("model.layers.10.attn.q.weight"));
  CHECK(pos("model.layers.0.attn.q.bias") < pos("model.layers.1.attn.q.weight"));
  // Module order, not names: the file stores lm_head first (tests/runtime/plan/order_test.cc).
  CHECK(pos("model.embed_tokens.weight") < pos("model.layers.0.attn.q.bias"));
  CHECK(pos("lm_head.weight") == static_cast<std::ptrdiff_t>(names.size()) - 1);
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
    if (r.route != ReadRoute::kStaged && !r.shared_buffer) CHECK(r.tensors.size() == 1);
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

TEST_CASE("plan: small unconverted CPU neighbours share one buffer, converted ones are staged") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  PlanOptions options;
  options.dtype = DType::kF32;  // bf16/f16 small tensors are cast (staged), f32 and ints are not
  auto plan = Plan(ckpt, options);
  REQUIRE(plan.ok());
  size_t shared = 0, staged_small = 0;
  for (const ReadChunk& r : plan->reads) {
    uint64_t at = r.offset;
    for (uint32_t t : r.tensors) {
      const TensorPlan& tp = plan->tensors[t];
      const TensorInfo& src = ckpt.tensors()[tp.source];
      CHECK(src.offset <= at);  // in file order, no gap a shared buffer would not hold
      at = src.offset + src.nbytes;
      if (r.shared_buffer) {
        CHECK(tp.conversion == Conversion::kNone);
        CHECK(plan->device_of(t) == Device::Cpu());
        CHECK(tp.fresh_pages == (r.length >= (64 << 10)));  // the block's, not the tensor's
      }
    }
    if (r.shared_buffer) {
      ++shared;
      CHECK((r.route == ReadRoute::kFreshPages || r.route == ReadRoute::kStagedWhenCold));
    } else if (ckpt.tensors()[plan->tensors[r.tensors.front()].source].nbytes < (1 << 20)) {
      ++staged_small;  // the f16 norm, cast to f32
      CHECK(r.route == ReadRoute::kStaged);
    }
  }
  CHECK(shared > 0);
  CHECK(staged_small > 0);
  // Asked for 64-byte alignment, nothing shares a buffer: small tensors are staged one by one.
  options.routes.align_tensors = true;
  auto aligned = Plan(ckpt, options);
  REQUIRE(aligned.ok());
  for (const ReadChunk& r : aligned->reads) CHECK_FALSE(r.shared_buffer);
}

TEST_CASE("plan: each tensor's memory kind follows from its device, flags and reads") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir, 1'000'000'000);
  auto kinds = [&](const LoadPlan& plan) {
    std::map<TensorMemory, size_t> out;
    for (const TensorPlan& tp : plan.tensors) ++out[tp.memory];
    return out;
  };
  PlanOptions options;
  options.dtype = DType::kF32;  // small casts are staged: arena
  auto plan = Plan(ckpt, options);
  REQUIRE(plan.ok());
  std::vector<bool> shared(plan->tensors.size()), staged_only(plan->tensors.size(), true);
  for (const ReadChunk& r : plan->reads) {
    for (uint32_t t : r.tensors) {
      shared[t] = shared[t] || r.shared_buffer;
      staged_only[t] = staged_only[t] && r.route == ReadRoute::kStaged;
    }
  }
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) {
    const TensorPlan& tp = plan->tensors[t];
    INFO(ckpt.tensors()[tp.source].name << ": " << TensorMemoryName(tp.memory));
    if (shared[t]) {
      CHECK(tp.memory == TensorMemory::kShared);
    } else if (tp.fresh_pages) {
      CHECK(tp.memory == TensorMemory::kFreshPages);
    } else if (tp.nbytes < kArenaTensorMax && staged_only[t]) {
      CHECK(tp.memory == TensorMemory::kArena);
    } else {
      CHECK(tp.memory == TensorMemory::kHost);
    }
  }
  const auto cpu = kinds(*plan);
  CHECK(cpu.count(TensorMemory::kShared) == 1);
  CHECK(cpu.count(TensorMemory::kFreshPages) == 1);
  CHECK(cpu.count(TensorMemory::kArena) == 1);

  PlanOptions without_fresh = options;  // and no fresh pages: host buffers of their own
  without_fresh.routes.fill_fresh_pages = false;
  auto host = Plan(ckpt, without_fresh);
  REQUIRE(host.ok());
  CHECK(kinds(*host).count(TensorMemory::kFreshPages) == 0);
  CHECK(kinds(*host).count(TensorMemory::kHost) == 1);

  PlanOptions mapped;  // unconverted tensors point into the file
  mapped.routes.mmap = true;
  auto map = Plan(ckpt, mapped);
  REQUIRE(map.ok());
  for (const TensorPlan& tp : map->tensors) {
    CHECK(tp.memory == (tp.conversion == Conversion::kNone ? TensorMemory::kMapped
                                                           : tp.nbytes < kArenaTensorMax
                                                                 ? TensorMemory::kArena
                                                                 : TensorMemory::kHost));
  }

  PlanOptions gpu;
  gpu.device_map = "cuda:0";
  auto on_gpu = Plan(ckpt, gpu);
  REQUIRE(on_gpu.ok());
  CHECK(kinds(*on_gpu) == std::map<TensorMemory, size_t>{{TensorMemory::kDevice,
                                                          on_gpu->tensors.size()}});

  PlanOptions given = options;  // the caller's memory, then pinned
  given.caller_memory = [](const TensorInfo& t) { return t.name == "lm_head.weight"; };
  given.pin_cpu_tensors = true;
  auto mixed = Plan(ckpt, given);
  REQUIRE(mixed.ok());
  for (const TensorPlan& tp : mixed->tensors) {
    CHECK(tp.memory == (ckpt.tensors()[tp.source].name == "lm_head.weight" ? TensorMemory::kCaller
                                                                           : TensorMemory::kPinned));
  }
}

TEST_CASE("plan: each conversion runs where its device puts it") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  for (const char* map : {"cpu", "cuda:0"}) {
    INFO(map);
    PlanOptions options;
    options.device_map = map;
    options.dtype = DType::kF32;
    auto plan = Plan(ckpt, options);
    REQUIRE(plan.ok());
    std::set<ConversionSite> sites;
    for (const TensorPlan& tp : plan->tensors) {
      INFO(ckpt.tensors()[tp.source].name << ": " << ConversionSiteName(tp.conversion_site));
      sites.insert(tp.conversion_site);
      const ConversionSite converts =
          std::string(map) == "cpu" ? ConversionSite::kCpu : ConversionSite::kDevice;
      CHECK(tp.conversion_site ==
            (tp.conversion == Conversion::kNone ? ConversionSite::kNone : converts));
    }
    CHECK(sites.size() == 2);  // some tensors are cast, some are f32 already
  }
}

TEST_CASE("plan: --dtype casts floats, never integers or bool, keep_in_fp32 is anchored") {
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

TEST_CASE("plan: device maps route tensors, GPU tensors are always staged") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions one;
  one.device_map = "cuda:1";
  auto all_on_one = Plan(ckpt, one);
  REQUIRE(all_on_one.ok());
  REQUIRE(all_on_one->targets == std::vector<Device>{Device::Cuda(1)});
  for (const TensorPlan& t : all_on_one->tensors) CHECK(t.device == 0);
  for (const ReadChunk& r : all_on_one->reads) CHECK(r.route == ReadRoute::kStaged);
  CHECK(all_on_one->devices.device_map.ToJson() == R"({"": 1})");

  PlanOptions balanced;
  balanced.device_map = "sequential";
  balanced.max_memory = MaxMemory{{"0", std::string("28MB")}, {"1", std::string("6MB")},
                                  {"cpu", std::string("1GB")}};
  auto split = Plan(ckpt, balanced);
  REQUIRE(split.ok());
  std::set<std::string> used;
  for (uint32_t t = 0; t < split->tensors.size(); ++t) used.insert(split->device_of(t).ToString());
  CHECK(used.count("cuda:0") == 1);
  CHECK(used.size() >= 2);
  for (uint32_t t = 0; t < split->tensors.size(); ++t) {
    CHECK(*split->devices.device_map.Lookup(ckpt.tensors()[split->tensors[t].source].name) ==
          split->device_of(t));
  }
}

TEST_CASE("plan: tensors mapped to disk are planned apart, read in place from safetensors") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions disk;
  disk.device_map = "sequential";
  disk.max_memory = MaxMemory{{"cpu", int64_t{1000}}};
  auto offloaded = Plan(ckpt, disk);
  REQUIRE(offloaded.ok());
  REQUIRE_FALSE(offloaded->offloaded.empty());
  uint64_t bytes = 0;
  for (const OffloadPlan& o : offloaded->offloaded) {
    const TensorInfo& t = ckpt.tensors()[o.source];
    CHECK(*offloaded->devices.device_map.Lookup(t.name) == Device::Disk());
    CHECK(o.in_place);  // plain safetensors tensors: no folder needed
    bytes += o.nbytes;
  }
  CHECK(offloaded->offloaded_bytes == bytes);
  CHECK(offloaded->tensors.size() + offloaded->offloaded.size() == ckpt.tensors().size());
  for (const TensorPlan& t : offloaded->tensors) {
    CHECK(*offloaded->devices.device_map.Lookup(ckpt.tensors()[t.source].name) != Device::Disk());
  }
  CHECK_THAT(offloaded->ToString(), Catch::Contains("read in place"));
}

TEST_CASE("plan: bad options are refused") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
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

namespace loadstone {
namespace {

TEST_CASE("plan: float8 scales that do not fit the block are refused, the right block fits") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  PlanOptions po;
  po.dtype = DType::kBF16;
  po.fp8_block = {64, 64};  // down_proj [700, 300] would need 11 x 5 scales, not 6 x 3
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.status().code() == StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  CHECK_THAT(msg, Catch::Contains("do not fit its shape"));
  CHECK_THAT(msg, Catch::Contains("float8 blocks of 64 x 64"));
  CHECK_THAT(msg, Catch::Contains("--fp8-block"));
  CHECK_THAT(msg, Catch::Contains("_scale_inv"));
  po.fp8_block = {0, 128};
  CHECK(Plan(m.ckpt, po).status().code() == StatusCode::kInvalidArgument);

  // The same scales read with another block size: 128 x 128 here, [6, 3] for [700, 300] also
  // fits 120 x 100 (ceil(700 / 120) = 6, ceil(300 / 100) = 3) — a checkpoint's own block wins.
  TempDir one;
  std::vector<std::byte> codes(700 * 300), scales(6 * 3 * 4);
  REQUIRE(WriteSafetensors(one.Path("m.safetensors"),
                           {{"w", DType::kF8E4M3, {700, 300}, codes, {}},
                            {"w_scale_inv", DType::kF32, {6, 3}, scales, {}}})
              .ok());
  auto ckpt = Checkpoint::Open(one.Path("m.safetensors"));
  REQUIRE(ckpt.ok());
  po.fp8_block = {120, 100};
  auto fits = Plan(*ckpt, po);
  REQUIRE(fits.ok());
  CHECK(fits->tensors[1].conversion == Conversion::kDequantFp8Block);
  CHECK(fits->tensors[1].block_rows == 120);
  CHECK(fits->tensors[1].block_cols == 100);
  // A scale that is not f32 is refused by name.
  TempDir bad;
  std::vector<std::byte> half_scales(6 * 3 * 2);
  REQUIRE(WriteSafetensors(bad.Path("m.safetensors"),
                           {{"w", DType::kF8E4M3, {700, 300}, codes, {}},
                            {"w_scale_inv", DType::kBF16, {6, 3}, half_scales, {}}})
              .ok());
  auto bad_ckpt = Checkpoint::Open(bad.Path("m.safetensors"));
  REQUIRE(bad_ckpt.ok());
  po.fp8_block = {128, 128};
  CHECK(Plan(*bad_ckpt, po).status().code() == StatusCode::kInvalidArgument);
}

// compressed-tensors `float-quantized`: `W_scale` says by its shape how it covers W.
TEST_CASE("plan: compressed-tensors float8 scales per tensor, channel, group and block") {
  struct Case {
    std::vector<uint64_t> weight, scale;
    DType scale_dtype;
    uint64_t block_rows, block_cols;  // 0: refused
  };
  const Case cases[] = {
      {{256, 384}, {}, DType::kF32, 256, 384},          // per tensor, 0-d
      {{256, 384}, {1}, DType::kBF16, 256, 384},        // per tensor, [1]
      {{256, 384}, {256, 1}, DType::kBF16, 1, 384},     // per channel
      {{256, 384}, {256, 3}, DType::kF16, 1, 128},      // per group of 128
      {{256, 384}, {256, 6}, DType::kF32, 1, 64},       // per group of 64
      {{256, 384}, {2, 3}, DType::kF32, 128, 128},      // per block
      {{300, 200}, {3, 2}, DType::kF32, 128, 128},      // per block, ragged edges
      {{256, 384}, {256, 5}, DType::kF32, 0, 0},        // 5 groups do not divide 384
      {{256, 384}, {256, 1}, DType::kI32, 0, 0},        // integer scales
      {{256, 384}, {2, 1, 3}, DType::kF32, 0, 0},       // 3-D scales
      {{4, 256, 384}, {4, 256, 1}, DType::kF32, 0, 0},  // a 3-D weight
  };
  for (const Case& c : cases) {
    CAPTURE(c.weight, c.scale, TorchName(c.scale_dtype));
    TempDir dir;
    uint64_t w_elems = 1, s_elems = 1;
    for (uint64_t d : c.weight) w_elems *= d;
    for (uint64_t d : c.scale) s_elems *= d;
    std::vector<std::byte> codes(w_elems), scales(s_elems * DTypeBits(c.scale_dtype) / 8);
    REQUIRE(WriteSafetensors(dir.Path("m.safetensors"),
                             {{"proj.weight", DType::kF8E4M3, c.weight, codes, {}},
                              {"proj.weight_scale", c.scale_dtype, c.scale, scales, {}},
                              {"proj.input_scale", DType::kF32, {}, std::vector<std::byte>(4), {}}})
                .ok());
    auto ckpt = Checkpoint::Open(dir.Path("m.safetensors"));
    REQUIRE(ckpt.ok());
    PlanOptions po;
    po.dtype = DType::kBF16;
    auto plan = Plan(*ckpt, po);
    if (c.block_rows == 0) {
      INFO(plan.status().ToString());
      REQUIRE(plan.status().code() == StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(plan.status().message()),
                 Catch::Contains("'proj.weight_scale'") && Catch::Contains("per channel") &&
                     Catch::Contains("without --dtype"));
      continue;
    }
    REQUIRE(plan.ok());
    std::map<std::string, const TensorPlan*> by_name;
    for (const TensorPlan& t : plan->tensors) by_name[ckpt->tensors()[t.source].name] = &t;
    const TensorPlan& w = *by_name.at("proj.weight");
    CHECK(w.conversion == Conversion::kDequantFp8Block);
    CHECK(w.dtype == DType::kBF16);
    CHECK(w.block_rows == c.block_rows);
    CHECK(w.block_cols == c.block_cols);
    CHECK(&plan->tensors[w.scale] == by_name.at("proj.weight_scale"));
    CHECK(w.scale + 1 == static_cast<uint32_t>(&w - plan->tensors.data()));  // right before
    CHECK(by_name.at("proj.weight_scale")->dtype == c.scale_dtype);  // scales as stored
    CHECK(by_name.at("proj.weight_scale")->conversion == Conversion::kNone);
    // The activation scale is an ordinary f32 tensor: cast like any other.
    CHECK(by_name.at("proj.input_scale")->conversion == Conversion::kCast);
    // Without a target dtype nothing is dequantized.
    auto stored = Plan(*ckpt, PlanOptions{});
    REQUIRE(stored.ok());
    for (const TensorPlan& t : stored->tensors) CHECK(t.conversion == Conversion::kNone);
  }
}

}  // namespace
}  // namespace loadstone
