// DeepSeek-style float8 weights through the pipeline: each weight dequantized with its own
// scales (read first, possibly from another shard), across chunks that start mid-row, with
// completions in any order and a staging pool of two slots; a failed scales read fails the load.
#include <catch2/catch.hpp>

#include "cold_reader.h"
#include "io/fault_reader.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"
#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

// What a dequantized weight must hold: the CPU reference (tested against the formats'
// definitions in tests/runtime/convert) over the whole tensor at once.
std::vector<std::byte> ExpectedDequant(const testing::Fp8Checkpoint& m, const std::string& name,
                                       DType to) {
  const TensorInfo& w = *m.ckpt.Find(name);
  const std::vector<std::byte>& scales = m.bytes.at(name + "_scale_inv");
  const uint64_t cols = w.shape[1];
  const convert::Fp8BlockScales layout{scales.data(), cols, 128, 128, (cols + 127) / 128};
  std::vector<std::byte> out(w.numel() * DTypeBits(to) / 8);
  REQUIRE(convert::DequantFp8Block(w.dtype, to, m.bytes.at(name).data(), out.data(), 0, w.numel(),
                                   layout)
              .ok());
  return out;
}

void CheckFp8Load(const testing::Fp8Checkpoint& m, LoadHandle& load, DType to) {
  REQUIRE(load.Done().get().ok());
  int dequantized = 0;
  for (const TensorInfo& info : m.ckpt.tensors()) {
    const Tensor t = load.Tensor(info.name).get();
    INFO(info.name);
    const bool scale = info.name.ends_with("_scale_inv");
    const bool paired = m.ckpt.Find(info.name + "_scale_inv") != nullptr;
    if (scale) {  // scales stay as stored
      CHECK(t.dtype() == DType::kF32);
      CHECK(testing::HostBytes(t) == m.bytes.at(info.name));
    } else if (paired) {
      CHECK(t.dtype() == to);
      CHECK(testing::HostBytes(t) == ExpectedDequant(m, info.name, to));
      ++dequantized;
    } else {  // a plain cast (the float8 weight without scales, the bf16 tensors)
      std::vector<std::byte> cast(info.numel() * DTypeBits(to) / 8);
      REQUIRE(convert::CastBuffer(info.dtype, to, m.bytes.at(info.name).data(), cast.data(),
                                  info.numel())
                  .ok());
      CHECK(testing::HostBytes(t) == cast);
    }
  }
  CHECK(dequantized == 4);
}

// Completions shuffled six at a time, every range cold: the scales go through staging too, so
// they are in place only once a worker has copied them — after their completion was handled.
// Loads that see cold files and reads that complete late and out of order (EIO at `eio` while
// `*faults_on` holds).
LoaderOptions ColdAndReordered(LoaderOptions lo = {}, std::vector<io::FaultOptions::FileByte> eio = {},
                               std::shared_ptr<std::atomic<bool>> faults_on = nullptr) {
  static std::atomic<int> asked{0};
  io::FaultOptions faults;
  faults.reorder_window = 6;
  faults.latency = std::chrono::microseconds(200);
  faults.eio_at = std::move(eio);
  return testing::ColdReads(&asked, faults, lo, std::move(faults_on));
}

TEST_CASE("fp8 block: the plan reads each weight's scales first, as stored, never coalesced") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  REQUIRE(m.ckpt.files().size() >= 3);
  // The scales were written last: in another shard than their weights.
  CHECK(m.ckpt.Find("model.layers.0.mlp.down_proj.weight_scale_inv")->file !=
        m.ckpt.Find("model.layers.0.mlp.down_proj.weight")->file);
  PlanOptions po;
  po.dtype = DType::kBF16;
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.ok());
  std::map<uint32_t, size_t> first_read;  // tensor → index of its first read
  for (size_t r = plan->reads.size(); r-- > 0;) {
    for (uint32_t t : plan->reads[r].tensors) first_read[t] = r;
  }
  int pairs = 0;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    const TensorPlan& tp = plan->tensors[i];
    const std::string& name = m.ckpt.tensors()[tp.source].name;
    INFO(name);
    if (tp.conversion != Conversion::kDequantFp8Block) continue;
    ++pairs;
    CHECK(tp.scale == i - 1);
    CHECK(m.ckpt.tensors()[plan->tensors[tp.scale].source].name == name + "_scale_inv");
    CHECK(plan->tensors[tp.scale].conversion == Conversion::kNone);
    CHECK(plan->tensors[tp.scale].dtype == DType::kF32);
    CHECK(tp.dtype == DType::kBF16);
    CHECK(tp.block_rows == 128);
    CHECK(first_read.at(tp.scale) < first_read.at(i));
    for (const ReadChunk& r : plan->reads) {
      const bool has = std::find(r.tensors.begin(), r.tensors.end(), i) != r.tensors.end() ||
                       std::find(r.tensors.begin(), r.tensors.end(), tp.scale) != r.tensors.end();
      if (has) CHECK(r.tensors.size() == 1);
    }
  }
  CHECK(pairs == 4);
  CHECK_THAT(plan->ToString(), Catch::Contains("1 casts, 4 float8 block dequants"));
  // The float8 weight without scales is a plain cast.
  for (const TensorPlan& tp : plan->tensors) {
    if (m.ckpt.tensors()[tp.source].name == "model.layers.1.plain_fp8.weight") {
      CHECK(tp.conversion == Conversion::kCast);
    }
  }
}

TEST_CASE("fp8 block: the CPU load dequantizes with the right scales, in any completion order") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  const DType to = GENERATE(DType::kBF16, DType::kF32, DType::kF16);
  const bool reorder = GENERATE(false, true);
  const uint64_t staging = GENERATE(uint64_t{0}, uint64_t{1});  // default, or two slots
  PlanOptions po;
  po.dtype = to;
  // Pieces that start mid-row and mid-block; or whole weights, whose dequantized output is
  // written in several blocks when it goes into fresh pages (ReadRouteOptions::fill_fresh_pages).
  po.max_chunk = GENERATE(uint64_t{64} << 10, uint64_t{16} << 20);
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.ok());
  LoaderOptions lo;
  if (staging) lo.staging_bytes = staging;  // rounds up to the two-slot minimum
  Loader loader(reorder ? ColdAndReordered(lo) : lo);
  LoadHandle load = loader.Load(m.ckpt, *plan);
  CheckFp8Load(m, load, to);
}

TEST_CASE("fp8 block: a weight prioritized by its own name brings its scales, two slots never "
          "deadlock") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  PlanOptions po;
  po.dtype = DType::kBF16;
  po.max_chunk = 64 << 10;  // many pieces per weight, each holding a slot until its scales land
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.ok());
  LoaderOptions lo;
  lo.staging_bytes = 1;  // the two-slot minimum
  Loader loader(ColdAndReordered(lo));
  LoadHandle load = loader.Load(m.ckpt, *plan);
  // The weights, last first: each prefix is the weight alone, not its "_scale_inv" sibling.
  for (auto it = m.ckpt.tensors().rbegin(); it != m.ckpt.tensors().rend(); ++it) {
    if (m.ckpt.Find(it->name + "_scale_inv") != nullptr) REQUIRE(load.Prioritize(it->name).ok());
  }
  REQUIRE(load.Done().wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  CheckFp8Load(m, load, DType::kBF16);
}

TEST_CASE("fp8 block: without a dtype, weights and scales load as stored") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  auto plan = Plan(m.ckpt);
  REQUIRE(plan.ok());
  for (const TensorPlan& tp : plan->tensors) CHECK(tp.conversion == Conversion::kNone);
  Loader loader;
  LoadHandle load = loader.Load(m.ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  for (const TensorInfo& info : m.ckpt.tensors()) {
    INFO(info.name);
    CHECK(testing::HostBytes(load.Tensor(info.name).get()) == m.bytes.at(info.name));
  }
}

TEST_CASE("fp8 block: EIO in a scales read fails the load, naming the read that met it, and the Loader goes on") {
  TempDir dir;
  const auto m = testing::WriteFp8Checkpoint(dir);
  const TensorInfo& victim = *m.ckpt.Find("model.layers.1.mlp.gate_proj.weight_scale_inv");
  PlanOptions po;
  po.dtype = DType::kBF16;
  po.max_chunk = 64 << 10;
  auto plan = Plan(m.ckpt, po);
  REQUIRE(plan.ok());
  auto faults_on = std::make_shared<std::atomic<bool>>(true);
  Loader loader(ColdAndReordered({}, {{victim.file, victim.offset + 4}}, faults_on));
  LoadHandle failed = loader.Load(m.ckpt, *plan);
  const Status status = failed.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kIOError);
  // Staged reads take whole pages (docs/pipeline.md), so the read that meets the bad byte may be
  // a neighbour's whose page it shares: the error names that read's tensor and file.
  const uint64_t bad = victim.offset + 4, page = 4096;
  bool named = false;
  for (const TensorInfo& t : m.ckpt.tensors()) {
    const bool shares_page = t.file == victim.file && t.offset / page * page <= bad &&
                             bad < (t.offset + t.nbytes + page - 1) / page * page;
    named |= shares_page && status.message().find("'" + t.name + "'") != std::string_view::npos;
  }
  CHECK(named);
  CHECK_THAT(std::string(status.message()), Catch::Contains(m.ckpt.files()[victim.file].path));
  CHECK(failed.Tensors().empty());
  CHECK_THROWS_AS(failed.Tensor("model.layers.1.mlp.gate_proj.weight").get(), Error);
  faults_on->store(false);  // cold and reordered still, no EIO
  LoadHandle again = loader.Load(m.ckpt, *plan);
  CheckFp8Load(m, again, DType::kBF16);
}

}  // namespace
}  // namespace loadstone
