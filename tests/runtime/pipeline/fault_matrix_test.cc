// The fault matrix (its table is in docs/reliability.md): every fault a load can meet ×
// each read backend (io_uring, pread) × a CPU and a simulated-device destination. Each cell ends
// as its row says — a clean error naming the file and where, or, for a fault the reader rides
// out, a load whose every byte is right — within a watchdog; the device then holds no byte of
// the load, and the same Loader loads another checkpoint byte for byte. Every read goes to the
// kernel (the reader is wrapped, so no page-cache copy stands in for it). ASan finds what a cell
// leaks. LOADSTONE_FAULT_MATRIX=FILE appends each cell's outcome to FILE as a table row.
#include <fcntl.h>
#include <fmt/format.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>

#include "io/fault_reader.h"
#include "io/formats/offload_folder.h"
#include "io/reader_wrapper.h"
#include "loadstone/loader.h"
#include "loadstone/offload.h"
#include "runtime/sim/sim_device.h"
#include "test_model.h"
#include "tests/runtime/pipeline/test_platform.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Longer than any cell takes under TSan; a cell that runs past it has hung.
constexpr auto kWatchdog = std::chrono::seconds(120);

enum class Dest { kCpu, kDevice };
struct Column {
  ReadBackend backend;
  Dest dest;
};
constexpr std::array<Column, 4> kColumns = {{{ReadBackend::kUring, Dest::kCpu},
                                             {ReadBackend::kUring, Dest::kDevice},
                                             {ReadBackend::kPread, Dest::kCpu},
                                             {ReadBackend::kPread, Dest::kDevice}}};

std::string ColumnName(Column c) {
  return fmt::format("{} → {}", c.backend == ReadBackend::kUring ? "io_uring" : "pread",
                     c.dest == Dest::kCpu ? "cpu" : "cuda:0");
}

// cuda:0: a simulated device that refuses allocations, or pinning, while told to.
class RefusingDevice final : public device::Accelerator {
 public:
  RefusingDevice() : sim_(MakeSim()) {}

  // The next `granted` allocations succeed, then every one is refused (-1: none refused).
  void RefuseAllocationsAfter(int granted) {
    left_ = granted;
    refusing_ = granted >= 0;
  }
  void RefusePinning(bool refuse) { refuse_pinning_ = refuse; }
  uint64_t allocated_bytes() const { return sim_->allocated_bytes(); }

  device::DeviceInfo Info() const override { return sim_->Info(); }
  Result<device::DeviceMemory> Allocate(uint64_t bytes) override {
    if (refusing_.load() && left_.fetch_sub(1) <= 0) {
      return Status::OutOfMemory(
          fmt::format("cuda:0: out of memory for {} bytes (refused by the test)", bytes));
    }
    return sim_->Allocate(bytes);
  }
  Result<device::HostStaging> AllocateStaging(uint64_t bytes) override {
    auto staging = sim_->AllocateStaging(bytes);
    if (staging.ok() && refuse_pinning_) {  // as a GPU's host memory that could not be pinned
      staging->simulated = false;
      staging->why_pageable = "pinning failed: cudaHostAlloc: out of memory (refused by the test)";
    }
    return staging;
  }
  bool CanConvert(DType from, DType to) const override { return sim_->CanConvert(from, to); }
  bool CanDequantFp8Block(DType from, DType to) const override {
    return sim_->CanDequantFp8Block(from, to);
  }
  bool DecodesQuantized() const override { return sim_->DecodesQuantized(); }
  void Submit(device::PlaceJob job) override { sim_->Submit(std::move(job)); }
  Status CopyToHost(const std::byte* src, uint64_t bytes, std::byte* dst) override {
    return sim_->CopyToHost(src, bytes, dst);
  }
  void Drain() override { sim_->Drain(); }

 private:
  static std::shared_ptr<device::SimDevice> MakeSim() {
    device::SimDeviceOptions o;
    o.latency = std::chrono::microseconds(300);  // device jobs are in flight when a cancel comes
    return std::make_shared<device::SimDevice>(o);
  }
  std::shared_ptr<device::SimDevice> sim_;
  std::atomic<int> left_{0};
  std::atomic<bool> refusing_{false};
  std::atomic<bool> refuse_pinning_{false};
};

// Says every range is cold, so that every read goes to the kernel through the backend.
class KernelReads final : public io::ReaderWrapper {
 public:
  explicit KernelReads(std::unique_ptr<io::Reader> inner) : ReaderWrapper(std::move(inner)) {}
  bool ReadsDirect(uint32_t, uint64_t, uint64_t) const override { return true; }
};

// Appends a cell's outcome to the table LOADSTONE_FAULT_MATRIX names (if it names one).
void RecordCell(const std::string& fault, Column column, const std::string& outcome) {
  const char* path = std::getenv("LOADSTONE_FAULT_MATRIX");
  if (path == nullptr) return;
  static std::mutex mu;
  std::lock_guard lock(mu);
  std::ofstream(path, std::ios::app)
      << fault << '\t' << ColumnName(column) << '\t' << outcome << '\n';
}

// What the cell's faulted load meets; set before it starts, off for the load after it.
struct Faults {
  std::atomic<bool> on{true};
  std::function<void(io::ReaderOptions*)> reader_options;  // the backend's testing knobs
  std::optional<io::FaultOptions> inject;                  // FaultInjectingReader
  std::function<bool(LoadStage)> at_stage;                 // true: cancel there
  bool refuse_userfaultfd = false;
  std::atomic<bool> full_disk{false};  // offload files are written into /dev/full (ENOSPC)
};

// One cell: the mixed checkpoint, cuda:0, and a Loader on the column's backend whose loads meet
// `faults` while they are on.
struct Cell {
  Cell(std::string fault_name, Column where, LoaderOptions options = {})
      : fault(std::move(fault_name)), column(where) {
    LoadHooks hooks;
    hooks.open_reader = [f = faults](const std::vector<std::string>& paths,
                                     const io::ReaderOptions& o,
                                     std::string* log) -> Result<std::unique_ptr<io::Reader>> {
      io::ReaderOptions tweaked = o;
      const bool on = f->on.load();
      if (on && f->reader_options) f->reader_options(&tweaked);
      LOADSTONE_ASSIGN_OR_RETURN(auto reader, io::OpenReader(paths, tweaked, log));
      if (on && f->inject) {
        LOADSTONE_ASSIGN_OR_RETURN(
            reader, io::FaultInjectingReader::Create(std::move(reader), paths, *f->inject));
      }
      return std::unique_ptr<io::Reader>(std::make_unique<KernelReads>(std::move(reader)));
    };
    hooks.cancel_at = [f = faults](LoadStage stage) {
      return f->on.load() && f->at_stage && f->at_stage(stage);
    };
    hooks.refuse_userfaultfd = [f = faults] { return f->on.load() && f->refuse_userfaultfd; };
    hooks.create_offload_file = [f = faults](const std::string&) {
      return f->on.load() && f->full_disk ? ::open("/dev/full", O_WRONLY | O_CLOEXEC) : -1;
    };
    options.backend = column.backend;
    options.platform = testing::TestPlatform({gpu});
    options.hooks = std::make_shared<const LoadHooks>(std::move(hooks));
    loader = std::make_unique<Loader>(options);
  }

  LoadPlan PlanFor(const Checkpoint& checkpoint, PlanOptions po = {}) const {
    po.device_map = column.dest == Dest::kCpu ? "cpu" : "cuda:0";
    auto plan = Plan(checkpoint, po);
    REQUIRE(plan.ok());
    return *std::move(plan);
  }
  LoadHandle Load(PlanOptions po = {}, LoadOptions lo = {}) {
    return loader->Load(ckpt, PlanFor(ckpt, po), lo);
  }

  // The faulted load's outcome, in the table of LOADSTONE_FAULT_MATRIX.
  void Record(const std::string& outcome) const { RecordCell(fault, column, outcome); }
  void Record(const Status& status) const {
    std::string message(status.message());
    if (message.size() > 160) message = message.substr(0, 157) + "...";
    Record(fmt::format("{}: {}", StatusCodeName(status.code()), message));
  }

  // Faults off; the same Loader then loads a fresh checkpoint to the same destination, every
  // byte as written, and the device holds nothing once it is let go.
  void RequireNextLoadExact() {
    faults->on = false;
    gpu->RefuseAllocationsAfter(-1);
    gpu->RefusePinning(false);
    CHECK(gpu->allocated_bytes() == 0);  // the faulted load gave back every device byte
    TempDir next_dir;
    const Checkpoint next = testing::WriteMixedCheckpoint(next_dir);
    {
      LoadHandle load = loader->Load(next, PlanFor(next));
      REQUIRE(Wait(load).ok());
      REQUIRE(load.Tensors().size() == next.tensors().size());
      for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
    }
    CHECK(gpu->allocated_bytes() == 0);
  }

  // Done()'s status; a load with no outcome within the watchdog aborts the run, naming the cell
  // (a hang must not wait for ctest's timeout, nor pass).
  Status Wait(const LoadHandle& load) const {
    auto done = load.Done();
    if (done.wait_for(kWatchdog) != std::future_status::ready) {
      std::fprintf(stderr, "fault matrix: %s, %s: no outcome after %lld s: hung\n", fault.c_str(),
                   ColumnName(column).c_str(), static_cast<long long>(kWatchdog.count()));
      std::abort();
    }
    return done.get();
  }

  const std::string fault;
  const Column column;
  std::shared_ptr<Faults> faults = std::make_shared<Faults>();
  std::shared_ptr<RefusingDevice> gpu = std::make_shared<RefusingDevice>();
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  std::unique_ptr<Loader> loader;  // last: destroyed first
};

// A failed load: `code`, every fragment of `named` in the message, and nothing passed off as
// loaded (no tensor list; a tensor's future holds the same error unless it was whole before).
void RequireCleanError(const Cell& cell, const LoadHandle& load, const Status& status,
                       StatusCode code, const std::vector<std::string>& named) {
  INFO(status.ToString());
  REQUIRE(status.code() == code);
  for (const std::string& fragment : named) {
    CHECK_THAT(std::string(status.message()), Catch::Contains(fragment));
  }
  CHECK(load.Tensors().empty());
  const Progress progress = load.progress();
  CHECK(progress.tensors_done < progress.tensors_total);
  for (const TensorInfo& info : cell.ckpt.tensors()) {
    try {
      (void)load.Tensor(info.name).get();
    } catch (const Error& e) {
      CHECK(e.status().code() == code);
    }
  }
  cell.Record(status);
}

// A load that rode out its fault: every tensor, every byte as written.
void RequireExact(const Cell& cell, const LoadHandle& load, const Status& status,
                  const std::string& outcome) {
  INFO(status.ToString());
  REQUIRE(status.ok());
  REQUIRE(load.Tensors().size() == cell.ckpt.tensors().size());
  for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
  cell.Record(outcome);
}

const std::string& PathOf(const Cell& cell, const TensorInfo& t) {
  return cell.ckpt.files()[t.file].path;
}

// `path` rewritten elsewhere with every tensor byte flipped (same size and header), ready to be
// renamed over it.
std::string FlippedCopy(const Cell& cell, uint32_t file) {
  const std::string& path = cell.ckpt.files()[file].path;
  uint64_t data_start = cell.ckpt.files()[file].bytes;
  for (const TensorInfo& t : cell.ckpt.tensors()) {
    if (t.file == file) data_start = std::min(data_start, t.offset);
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t i = data_start; i < bytes.size(); ++i) bytes[i] = static_cast<char>(~bytes[i]);
  const std::string copy = cell.dir.Path(fmt::format("replacement-{}", file));
  std::ofstream(copy, std::ios::binary) << bytes;
  return copy;
}

TEST_CASE("fault matrix: EIO in the middle of a shard → IOError naming file, tensor, offset") {
  for (const Column column : kColumns) {
    Cell cell("EIO in the middle of a shard", column);
    INFO(ColumnName(column));
    const TensorInfo* victim = cell.ckpt.Find("model.layers.1.attn.q.weight");
    REQUIRE(victim != nullptr);
    const uint64_t bad = victim->offset + victim->nbytes / 2;
    cell.faults->inject = io::FaultOptions{.eio_at = {{victim->file, bad}}};
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      RequireCleanError(cell, load, status, StatusCode::kIOError,
                        {PathOf(cell, *victim), victim->name, "offset"});
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: short reads (4097 bytes a call) → continued, every byte right") {
  for (const Column column : kColumns) {
    Cell cell("short reads (4097 bytes a call)", column);
    INFO(ColumnName(column));
    cell.faults->reader_options = [](io::ReaderOptions* o) { o->max_read_call = 4097; };
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      CHECK(load.read_stats().resubmits > 1000);
      RequireExact(cell, load, status,
                   fmt::format("OK, every byte; {} reads continued", load.read_stats().resubmits));
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: an EAGAIN storm (every other call) → retried, every byte right") {
  for (const Column column : kColumns) {
    Cell cell("EAGAIN storm (every other call of 64 KiB)", column);
    INFO(ColumnName(column));
    // The same load without the storm first: its calls of at most 64 KiB continue one another.
    uint32_t storm = 0;
    cell.faults->reader_options = [&storm](io::ReaderOptions* o) {
      o->eagain_every = storm;
      o->max_read_call = 64 << 10;
    };
    uint64_t calm = 0;
    {
      LoadHandle load = cell.Load();
      REQUIRE(cell.Wait(load).ok());
      calm = load.read_stats().resubmits;
    }
    storm = 2;
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      // Every other call refused: as many more resubmits as the calm load made calls (more than
      // its resubmits).
      const uint64_t stormy = load.read_stats().resubmits;
      CHECK(stormy > 2 * calm);
      RequireExact(
          cell, load, status,
          fmt::format("OK, every byte; {} resubmits (without the storm {})", stormy, calm));
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: a shard truncated after Open → Corruption naming file, tensor, bytes") {
  for (const Column column : kColumns) {
    Cell cell("file truncated after Open", column);
    INFO(ColumnName(column));
    const CheckpointFile& victim = cell.ckpt.files().front();
    fs::resize_file(victim.path, victim.bytes / 2);
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      RequireCleanError(cell, load, status, StatusCode::kCorruption,
                        {victim.path, "tensor '", "bytes "});
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: shards truncated during the load → an error naming file and offset") {
  for (const Column column : kColumns) {
    // One read in flight at a time: reads of every file remain when the first one is back.
    Cell cell("files truncated during the load", column, LoaderOptions{.queue_depth = 1});
    INFO(ColumnName(column));
    cell.faults->at_stage = [&cell](LoadStage stage) {
      if (stage != LoadStage::kMidStream) return false;
      for (const CheckpointFile& f : cell.ckpt.files()) fs::resize_file(f.path, f.bytes / 2);
      return false;
    };
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      INFO(status.ToString());
      // A read past the new end: Corruption ("truncated ... at offset"); the size check after
      // a read: Corruption ("is N bytes ... changed").
      RequireCleanError(cell, load, status, StatusCode::kCorruption,
                        {cell.dir.path(), "tensor '", "bytes "});
    }
    cell.RequireNextLoadExact();
  }
}

// The whole file's bytes, to put back after a cell has truncated it.
std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("fault matrix: a mapped shard truncated during the load → Corruption, no zeros loaded") {
  // --mmap maps CPU tensors only (a device's are staged): the CPU columns. The shard is cut
  // after it was mapped and before any tensor counts, its last tensor losing its last bytes
  // inside its final page — bytes a mapping reads as zeros, without SIGBUS. Many rounds: this
  // once passed such a tensor off as loaded in 3 runs of 4.
  constexpr int kRounds = 50;
  for (const Column column : kColumns) {
    if (column.dest != Dest::kCpu) continue;
    Cell cell("mapped file truncated during the load", column);
    INFO(ColumnName(column));
    PlanOptions mapped;
    mapped.routes.mmap = true;
    const uint32_t file = 0;
    const std::string path = cell.ckpt.files()[file].path;
    const TensorInfo* victim = nullptr;
    for (const TensorInfo& t : cell.ckpt.tensors()) {
      if (t.file == file && (!victim || t.offset > victim->offset)) victim = &t;
    }
    REQUIRE(victim != nullptr);
    const std::string victim_name = victim->name;
    const uint64_t end = victim->offset + victim->nbytes;
    const uint64_t lost = std::min<uint64_t>(564, (end - 1) % 4096);  // within end's page
    REQUIRE(lost > 0);
    const std::string original = FileBytes(path);
    cell.faults->at_stage = [&](LoadStage stage) {
      if (stage == LoadStage::kBeforeFirstRead) fs::resize_file(path, end - lost);  // mapped by now
      return false;
    };
    for (int round = 0; round < kRounds; ++round) {
      INFO("round " << round);
      {
        const LoadPlan plan = cell.PlanFor(cell.ckpt, mapped);
        REQUIRE(plan.routes.mmap);
        LoadHandle load = cell.loader->Load(cell.ckpt, plan);
        const Status status = cell.Wait(load);
        const std::vector<std::string> named = {path, victim_name, "bytes ", "changed"};
        if (round == 0) {
          RequireCleanError(cell, load, status, StatusCode::kCorruption, named);
        } else {
          INFO(status.ToString());
          REQUIRE(status.code() == StatusCode::kCorruption);
          for (const std::string& fragment : named) {
            REQUIRE_THAT(std::string(status.message()), Catch::Contains(fragment));
          }
          REQUIRE_THROWS_AS(load.Tensor(victim_name).get(), Error);
          REQUIRE(load.Tensors().empty());
        }
      }
      std::ofstream(path, std::ios::binary | std::ios::trunc) << original;  // whole again
      auto reopened = Checkpoint::Open(cell.dir.path());
      REQUIRE(reopened.ok());
      cell.ckpt = *std::move(reopened);
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: a shard replaced after Open → Corruption, nothing read from it") {
  for (const Column column : kColumns) {
    Cell cell("file replaced after Open (same size)", column);
    INFO(ColumnName(column));
    const std::string& victim = cell.ckpt.files().front().path;
    fs::rename(FlippedCopy(cell, 0), victim);
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      RequireCleanError(cell, load, status, StatusCode::kCorruption,
                        {victim, "changed since its header was read", "another file"});
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: shards replaced during the load → the files opened are read, exactly") {
  for (const Column column : kColumns) {
    Cell cell("files replaced during the load", column, LoaderOptions{.queue_depth = 1});
    INFO(ColumnName(column));
    std::vector<std::string> copies;
    for (uint32_t f = 0; f < cell.ckpt.files().size(); ++f) copies.push_back(FlippedCopy(cell, f));
    cell.faults->at_stage = [&](LoadStage stage) {
      if (stage != LoadStage::kMidStream) return false;
      for (uint32_t f = 0; f < copies.size(); ++f) fs::rename(copies[f], cell.ckpt.files()[f].path);
      return false;
    };
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      RequireExact(cell, load, status, "OK, every byte (of the files as opened)");
    }
    // The files there now are other files: the next load of this catalog is refused.
    LoadHandle again = cell.loader->Load(cell.ckpt, cell.PlanFor(cell.ckpt));
    CHECK(cell.Wait(again).code() == StatusCode::kCorruption);
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: ENOSPC in the offload folder → IOError naming the file and offset") {
  // A PyTorch .bin: its offloaded tensors are written out as .dat files (a safetensors
  // checkpoint's are read in place, nothing written).
  auto bin = Checkpoint::Open(std::string(LOADSTONE_SOURCE_DIR) +
                              "/tests/fixtures/offload/model/pytorch_model.bin");
  REQUIRE(bin.ok());
  for (const Column column : kColumns) {
    Cell cell("ENOSPC in the offload folder", column);
    INFO(ColumnName(column));
    const std::string folder = cell.dir.Path("offload");
    PlanOptions po;
    po.device_map = "auto";
    po.max_memory = column.dest == Dest::kCpu
                        ? MaxMemory{{"cpu", int64_t{25000}}}
                        : MaxMemory{{"0", int64_t{20000}}, {"cpu", int64_t{5000}}};
    po.offload_folder = folder;
    auto plan = Plan(*bin, po);
    REQUIRE(plan.ok());
    REQUIRE_FALSE(plan->offloaded.empty());
    // Every .dat file a full disk: written into /dev/full, whose writes fail with ENOSPC.
    cell.faults->full_disk = true;
    auto written = WriteOffload(*cell.loader, *bin, *plan);
    REQUIRE_FALSE(written.ok());
    const Status& status = written.status();
    INFO(status.ToString());
    CHECK(status.code() == StatusCode::kIOError);
    CHECK_THAT(std::string(status.message()), Catch::Contains(".dat") &&
                                                  Catch::Contains("offset") &&
                                                  Catch::Contains("the disk is full"));
    // The folder as it was: no NAME.dat, no index.json.
    CHECK((!fs::exists(folder) || fs::is_empty(folder)));
    cell.Record(status);
    // With room, the same Loader writes the folder.
    cell.faults->full_disk = false;
    auto again = WriteOffload(*cell.loader, *bin, *plan);
    REQUIRE(again.ok());
    CHECK(again->written == plan->offloaded.size());
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: a refused destination allocation → OutOfMemory naming the tensor") {
  for (const Column column : kColumns) {
    Cell cell("destination allocation refused", column);
    INFO(ColumnName(column));
    LoadOptions lo;
    if (column.dest == Dest::kCpu) {
      lo.host_memory_limit = cell.ckpt.total_bytes() / 3;
    } else {
      cell.gpu->RefuseAllocationsAfter(3);
    }
    {
      LoadHandle load = cell.Load({}, lo);
      const Status status = cell.Wait(load);
      RequireCleanError(cell, load, status, StatusCode::kOutOfMemory, {"tensor '"});
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: refused pinning → pinned tensors fail, staging goes on pageable") {
  for (const Column column : kColumns) {
    Cell cell("pinned allocation refused", column);
    INFO(ColumnName(column));
    cell.gpu->RefusePinning(true);
    {
      if (column.dest == Dest::kCpu) {  // CPU tensors asked in pinned memory: they cannot be
        PlanOptions po;
        po.pin_cpu_tensors = true;
        LoadHandle load = cell.Load(po);
        const Status status = cell.Wait(load);
        RequireCleanError(cell, load, status, StatusCode::kOutOfMemory,
                          {"could not pin", "tensor '"});
      } else {  // a device load's staging: pageable, said in the backend line
        LoadHandle load = cell.Load();
        const Status status = cell.Wait(load);
        CHECK_THAT(load.backend(), Catch::Contains("staging is pageable (pinning failed"));
        RequireExact(cell, load, status, "OK, every byte; staging pageable, said in backend()");
      }
    }
    cell.RequireNextLoadExact();
  }
}

TEST_CASE("fault matrix: userfaultfd refused → pages faulted in instead, said, every byte right") {
  for (const Column column : kColumns) {
    if (column.dest == Dest::kDevice) {  // device tensors are device memory, never fresh pages
      RecordCell("userfaultfd refused", column, "n/a: no CPU tensor to fill");
      continue;
    }
    Cell cell("userfaultfd refused", column);
    INFO(ColumnName(column));
    cell.faults->refuse_userfaultfd = true;
    {
      LoadHandle load = cell.Load();
      const Status status = cell.Wait(load);
      CHECK_THAT(load.backend(), Catch::Contains("fresh pages unavailable"));
      RequireExact(cell, load, status, "OK, every byte; \"fresh pages unavailable\" in backend()");
    }
    cell.RequireNextLoadExact();
  }
}

// Cancels at `stage` with plan options `po`; the load ends Cancelled, nothing passed off.
void CancelAt(const std::string& name, LoadStage stage, PlanOptions po, Column column) {
  Cell cell(name, column);
  INFO(ColumnName(column));
  std::atomic<int> asked{0};
  cell.faults->at_stage = [&asked, stage](LoadStage at) { return at == stage && ++asked == 1; };
  {
    LoadHandle load = cell.Load(po);
    const Status status = cell.Wait(load);
    CHECK(asked.load() >= 1);  // the stage was reached, and cancelled there
    if (stage == LoadStage::kBeforeFirstRead) CHECK(load.progress().bytes_read == 0);
    RequireCleanError(cell, load, status, StatusCode::kCancelled, {"cancelled"});
  }
  cell.RequireNextLoadExact();
}

PlanOptions ToBf16() {
  PlanOptions po;
  po.dtype = DType::kBF16;
  return po;
}

TEST_CASE("fault matrix: cancel before the first read → Cancelled") {
  for (const Column column : kColumns) {
    CancelAt("cancel before the first read", LoadStage::kBeforeFirstRead, {}, column);
  }
}

TEST_CASE("fault matrix: cancel mid-stream → Cancelled") {
  for (const Column column : kColumns) {
    CancelAt("cancel mid-stream (first read back)", LoadStage::kMidStream, {}, column);
  }
}

TEST_CASE("fault matrix: cancel during a conversion → Cancelled") {
  for (const Column column : kColumns) {
    // To bf16: on the CPU the workers convert; on the device its jobs do.
    CancelAt("cancel during a conversion (to bf16)",
             column.dest == Dest::kCpu ? LoadStage::kConverting : LoadStage::kDeviceCopy, ToBf16(),
             column);
  }
}

TEST_CASE("fault matrix: cancel during a device copy → Cancelled") {
  for (const Column column : kColumns) {
    if (column.dest == Dest::kCpu) {
      RecordCell("cancel during a device copy", column, "n/a: no device copy");
      continue;
    }
    CancelAt("cancel during a device copy", LoadStage::kDeviceCopy, {}, column);
  }
}

}  // namespace
}  // namespace loadstone
