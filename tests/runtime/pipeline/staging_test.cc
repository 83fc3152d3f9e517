// Cold reads through staging (ReadRouteOptions::stage_cold_reads): tensors the reader would fetch
// from the device are read into reused staging and copied into place by the workers.
#include <atomic>
#include <fstream>

#include <catch2/catch.hpp>

#include "io/fault_reader.h"
#include "io/reader_wrapper.h"
#include "loadstone/loader.h"
#include "cold_reader.h"
#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;
using testing::ColdReads;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("staging: cold tensors are staged and copied byte-exact, off means in place") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  const bool stage = GENERATE(true, false);
  PlanOptions po;
  po.routes.stage_cold_reads = stage;
  po.routes.fill_fresh_pages = false;  // with them, every large CPU read is a fresh-pages read
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  LoaderOptions lo;
  std::atomic<int> asked{0};
  Loader loader(ColdReads(&asked, {}, lo));
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  const auto tensors = load.Tensors();
  REQUIRE(tensors.size() == ckpt.tensors().size());
  for (const Tensor& t : tensors) {
    INFO(t.name());
    testing::CheckTensorBytes(t);
  }
  CHECK(load.progress().bytes_placed == ckpt.total_bytes());
  const std::string trace = testing::TraceText(load, dir);
  size_t in_place = 0;
  for (const ReadChunk& chunk : plan->reads) {
    in_place += chunk.route != ReadRoute::kStaged;
    if (chunk.route != ReadRoute::kStaged) {
      CHECK(chunk.route == (stage ? ReadRoute::kStagedWhenCold : ReadRoute::kInPlace));
    }
  }
  REQUIRE(in_place > 2);
  // Each chunk staged when cold, found cold, is read into staging and copied by a worker: one
  // read and one copy on that route each, and the trace says which route it took.
  const std::string cold_copy = R"("cat":"copy")";
  size_t cold_copies = 0, cold_reads = 0;
  for (size_t at = trace.find("\n"); at != std::string::npos; at = trace.find("\n", at + 1)) {
    const std::string line = trace.substr(at + 1, trace.find("\n", at + 1) - at - 1);
    if (line.find(R"x("planned":"staged when cold","route":"staged")x") == std::string::npos) {
      continue;
    }
    cold_copies += line.find(cold_copy) != std::string::npos;
    cold_reads += line.find(R"("cat":"read")") != std::string::npos;
  }
  if (stage) {
    CHECK(asked.load() == static_cast<int>(in_place));
    CHECK(cold_copies == in_place);
    CHECK(cold_reads == in_place);
  } else {
    CHECK(asked.load() == 0);
    CHECK(cold_copies == 0);
    CHECK(cold_reads == 0);
  }
}

TEST_CASE("staging: EIO in a cold staged read fails cleanly, the slot and Loader are reusable") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.routes.fill_fresh_pages = GENERATE(false, true);  // with fresh pages, every read is staged
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  const TensorInfo* victim = ckpt.Find("model.embed_tokens.weight");  // in place when warm
  REQUIRE(victim != nullptr);
  LoaderOptions lo;
  lo.staging_bytes = 1;  // two slots: a leaked one would stall the next load
  std::atomic<int> asked{0};
  io::FaultOptions faults;
  faults.eio_at.push_back({victim->file, victim->offset + victim->nbytes / 3});
  auto faults_on = std::make_shared<std::atomic<bool>>(true);
  Loader loader(ColdReads(&asked, faults, lo, faults_on));
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kIOError);
  CHECK_THAT(std::string(status.message()), Catch::Contains(victim->name));
  CHECK(load.Tensors().empty());
  if (!po.routes.fill_fresh_pages) CHECK(asked.load() > 0);

  faults_on->store(false);
  LoadHandle again = loader.Load(ckpt, *plan);
  REQUIRE(again.Done().get().ok());
  for (const Tensor& t : again.Tensors()) testing::CheckTensorBytes(t);
}

TEST_CASE("staging: a real cold load reads with O_DIRECT into staging, bytes exact") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  for (const CheckpointFile& f : ckpt.files()) REQUIRE(testing::DropFromPageCache(f.path));
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  if (load.backend().find("O_DIRECT ready on") == std::string::npos) {
    WARN("skipped: no O_DIRECT under " << dir.path() << ": " << load.backend());
    return;
  }
  for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
  const ReadStats stats = load.read_stats();
  CHECK(stats.direct_bytes > ckpt.total_bytes() / 2);
  // Staged reads take the whole pages around their chunk: only a file's last partial page goes
  // through the page cache, not every chunk's unaligned head and tail.
  uint64_t partial_last_pages = 0;
  for (const CheckpointFile& f : ckpt.files()) partial_last_pages += f.bytes % 4096;
  INFO("buffered " << stats.buffered_bytes << " bytes");
  CHECK(stats.buffered_bytes <= partial_last_pages);
  CHECK(Count(testing::TraceText(load, dir), "\"name\":\"copy ") > 0);
}

}  // namespace
}  // namespace loadstone
