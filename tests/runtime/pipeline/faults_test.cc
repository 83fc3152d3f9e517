// Faults end in a clean error naming file, tensor and offset; the Loader stays usable.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "io/fault_reader.h"
#include "io/reader_wrapper.h"
#include "loadstone/loader.h"
#include "tests/runtime/pipeline/test_platform.h"
#include "test_model.h"

namespace loadstone {
namespace {

using testing::TempDir;

// A follow-up load on the same Loader must succeed and be complete.
void RequireLoaderStillWorks(Loader& loader) {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  CHECK(load.Tensors().size() == ckpt.tensors().size());
}

void RequireNothingPassedOff(const LoadHandle& load, const Checkpoint& ckpt, const Status& why) {
  CHECK(load.Tensors().empty());
  const Progress p = load.progress();
  CHECK(p.tensors_done < p.tensors_total);
  for (const TensorInfo& info : ckpt.tensors()) {
    auto future = load.Tensor(info.name);
    try {
      (void)future.get();
    } catch (const Error& e) {
      CHECK(e.status().code() == why.code());
    }
  }
}

// `ckpt`'s plan, through file mappings when `mapped` (ReadRouteOptions::mmap).
LoadPlan PlanMapped(const Checkpoint& ckpt, bool mapped = true) {
  PlanOptions options;
  options.routes.mmap = mapped;
  return testing::MixedModel::PlanOf(ckpt, options);
}

TEST_CASE("faults: a shard deleted after Open → NotFound naming it") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  std::filesystem::remove(ckpt.files().back().path);
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status status = load.Done().get();
  REQUIRE(status.code() == StatusCode::kNotFound);
  CHECK_THAT(std::string(status.message()), Catch::Contains(ckpt.files().back().path));
  RequireNothingPassedOff(load, ckpt, status);
  RequireLoaderStillWorks(loader);
}

TEST_CASE("faults: a shard truncated after Open → Corruption naming file, tensor, offset") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  const CheckpointFile& victim = ckpt.files().front();
  std::filesystem::resize_file(victim.path, victim.bytes / 2);
  const auto backend = GENERATE(ReadBackend::kAuto, ReadBackend::kPread);
  LoaderOptions lo;
  lo.backend = backend;
  Loader loader(lo);
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kCorruption);
  const std::string msg(status.message());
  CHECK_THAT(msg, Catch::Contains(victim.path));
  CHECK_THAT(msg, Catch::Contains("tensor '"));
  CHECK_THAT(msg, Catch::Contains("bytes "));
  RequireNothingPassedOff(load, ckpt, status);
  RequireLoaderStillWorks(loader);
}

// Whether `load`'s workers copy cached chunks themselves (fresh pages need userfaultfd); says
// that the test is skipped when not.
bool WorkersCopyFromCache(const LoadHandle& load) {
  if (load.backend().find("fresh pages by the workers") != std::string::npos) return true;
  WARN("no userfaultfd here: the workers do not copy from the page cache, skipped");
  return false;
}

// Where ShrinkingAfterView cuts the file of the view it hands out.
enum class Cut {
  kInsideLastPage,  // 100 bytes before the view's end: the mapping reads the lost tail as zeros
  kAtViewStart,     // at the view's first byte: its later pages are past the end (SIGBUS)
};

// Hands out the real reader's page-cache views, and truncates the file right after one: the
// workers' copy out of that mapping then meets pages past the end of the file (which from user
// space would be SIGBUS).
class ShrinkingAfterView final : public io::ReaderWrapper {
 public:
  // `*shrunk` receives the path of the file it truncated; it must outlive the reader. Only a
  // view of file F ending at only_ending_at[F] is cut (the file's last tensor: then no other
  // read of that file meets the cut), once; `*cut_at` (when given) receives the offset.
  ShrinkingAfterView(std::unique_ptr<io::Reader> inner, std::vector<std::string> paths,
                     std::string* shrunk, Cut cut, std::map<uint32_t, uint64_t> only_ending_at,
                     uint64_t* cut_at = nullptr)
      : ReaderWrapper(std::move(inner)), paths_(std::move(paths)), shrunk_(shrunk),
        cut_at_(cut_at), cut_(cut), only_ending_at_(std::move(only_ending_at)) {}
  const std::byte* CachedView(uint32_t file, uint64_t offset, uint64_t length) const override {
    const std::byte* view = inner()->CachedView(file, offset, length);
    const auto target = only_ending_at_.find(file);
    const bool wanted = target != only_ending_at_.end() && target->second == offset + length;
    if (view != nullptr && wanted && !done_.exchange(true)) {
      const uint64_t cut = cut_ == Cut::kInsideLastPage ? offset + length - 100 : offset;
      std::filesystem::resize_file(paths_[file], cut);
      *shrunk_ = paths_[file];
      if (cut_at_) *cut_at_ = cut;
    }
    return view;
  }

 private:
  const std::vector<std::string> paths_;
  std::string* const shrunk_;
  uint64_t* const cut_at_;
  const Cut cut_;
  const std::map<uint32_t, uint64_t> only_ending_at_;
  mutable std::atomic<bool> done_{false};
};

// File -> the end of its last tensor, for the files whose last tensor is read in one chunk
// into fresh pages (256 KiB to 16 MiB): the views ShrinkingAfterView may cut.
std::map<uint32_t, uint64_t> LastTensorEnds(const Checkpoint& ckpt) {
  std::map<uint32_t, uint64_t> last_end;
  for (uint32_t f = 0; f < ckpt.files().size(); ++f) {
    const TensorInfo* last = nullptr;
    for (const TensorInfo& t : ckpt.tensors()) {
      if (t.file == f && (!last || t.offset > last->offset)) last = &t;
    }
    if (last && last->nbytes >= (256u << 10) && last->nbytes <= (16u << 20)) {
      last_end[f] = last->offset + last->nbytes;
    }
  }
  REQUIRE_FALSE(last_end.empty());
  return last_end;
}

// Into fresh pages the kernel copies (UFFDIO_COPY: EFAULT); into the caller's memory the workers
// copy with streaming stores (io/mapped_copy.h: the SIGBUS caught, the page named).
TEST_CASE("faults: a shard that shrinks under a page-cache copy → IOError, no SIGBUS") {
  const bool caller = GENERATE(false, true);
  INFO((caller ? "into the caller's memory" : "into fresh pages"));
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);  // just written: in the page cache
  PlanOptions opt;
  if (caller) opt.caller_memory = [](const TensorInfo&) { return true; };
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  // Cut at the start of a file's last tensor, whose pages the copy then finds past the end; no
  // other read of the file meets the cut (a read of it that did would fail first, Corruption).
  const std::map<uint32_t, uint64_t> last_end = LastTensorEnds(ckpt);
  std::string shrunk;  // written on the loop thread before the copy that fails
  testing::ReaderSwitch shrinking([&](const std::vector<std::string>& paths,
                                      const io::ReaderOptions& options,
                                      std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, options, log));
    return std::unique_ptr<io::Reader>(new ShrinkingAfterView(std::move(inner), paths, &shrunk,
                                                              Cut::kAtViewStart, last_end));
  });
  // Workers enough that no copy waits for one: a copy that waits asks for its view again, after
  // the cut, then reads the file and fails Corruption (a clean error, but not the copy's).
  LoaderOptions options = shrinking.Options();
  options.worker_threads = 64;
  REQUIRE(plan->reads.size() < 2 * 64);
  Loader loader(options);
  std::map<std::string, std::vector<std::byte>> memory;  // touched only on the loop thread
  LoadOptions lo;
  if (caller) {
    lo.destination = [&](const TensorInfo& t, const TensorPlan& tp) {
      auto& b = memory[t.name];
      b.assign(tp.nbytes, std::byte{0});
      return std::span<std::byte>(b);
    };
  }
  LoadHandle load = loader.Load(ckpt, *plan, lo);
  const Status status = load.Done().get();
  INFO(status.ToString() << "\nbackend: " << load.backend());
  if (!caller && !WorkersCopyFromCache(load)) return;
  REQUIRE(status.code() == StatusCode::kIOError);
  const std::string msg(status.message());
  CHECK_THAT(msg, Catch::Contains("shrank"));
  if (caller) CHECK_THAT(msg, Catch::Contains("SIGBUS") && Catch::Contains("page at byte"));
  CHECK_THAT(msg, Catch::Contains("tensor '"));
  REQUIRE_FALSE(shrunk.empty());
  CHECK_THAT(msg, Catch::Contains(shrunk));
  RequireNothingPassedOff(load, ckpt, status);
  shrinking.Off();
  RequireLoaderStillWorks(loader);
}

TEST_CASE("faults: a shard cut inside a copied page fails the tensor, never zeros it") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);  // just written: in the page cache
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  // The cut goes through the last tensor of a file, read in one chunk into fresh pages: nothing
  // after it fails the load first, so only the copy's own check can stop it from resolving.
  const std::map<uint32_t, uint64_t> last_end = LastTensorEnds(ckpt);
  std::string shrunk;
  uint64_t cut = 0;
  testing::ReaderSwitch cutting([&](const std::vector<std::string>& paths,
                                    const io::ReaderOptions& options,
                                    std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, options, log));
    return std::unique_ptr<io::Reader>(new ShrinkingAfterView(
        std::move(inner), paths, &shrunk, Cut::kInsideLastPage, last_end, &cut));
  });
  Loader loader(cutting.Options());
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status status = load.Done().get();
  INFO(status.ToString() << "\nbackend: " << load.backend());
  if (!WorkersCopyFromCache(load)) return;
  // Either the kernel faults on a source page past the new end (IOError, EFAULT) or the copy
  // succeeds with the page's lost tail read as zeros and the size check after it says so
  // (Corruption): which one depends on where the cut falls in the pages the copy touches.
  REQUIRE_FALSE(status.ok());
  CHECK((status.code() == StatusCode::kCorruption || status.code() == StatusCode::kIOError));
  CHECK_THAT(std::string(status.message()), Catch::Contains(shrunk));
  RequireNothingPassedOff(load, ckpt, status);
  // The tensor the cut runs through never resolves (it did, with its tail zeroed, before).
  size_t crossing = 0;
  for (const TensorInfo& t : ckpt.tensors()) {
    if (ckpt.files()[t.file].path != shrunk || t.offset >= cut || t.offset + t.nbytes <= cut) continue;
    ++crossing;
    CHECK_THROWS_AS(load.Tensor(t.name).get(), Error);
  }
  CHECK(crossing == 1);
}

// Same size, same inode, other bytes: only the modification time tells. Read, it would be
// tensors the catalog does not describe; mapped, pages it never checked.
TEST_CASE("faults: a shard rewritten in place after Open (same size) → Corruption before a read") {
  const bool mapped = GENERATE(false, true);
  INFO((mapped ? "mapped" : "read"));
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  const LoadPlan plan = PlanMapped(ckpt, mapped);
  const CheckpointFile& victim = ckpt.files().back();
  {
    std::fstream f(victim.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(victim.bytes - 1));
    f.put('\x5a');
  }
  // As a later write would stamp it: within one tick of the file system's clock as the Open,
  // the rewrite keeps the modification time (checkpoint.h, FileStamp).
  std::filesystem::last_write_time(
      victim.path, std::filesystem::last_write_time(victim.path) + std::chrono::seconds(1));
  Loader loader;
  LoadHandle load = loader.Load(ckpt, plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kCorruption);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(victim.path) && Catch::Contains("changed since its header was read") &&
                 Catch::Contains("rewritten"));
  CHECK(load.progress().bytes_read == 0);
  RequireNothingPassedOff(load, ckpt, status);
}

// The mmap route opens the files itself, after the reader: a file replaced in between (same
// size) is refused there, not mapped.
TEST_CASE("faults: a shard replaced between the reader's open and the mapping → Corruption") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  const LoadPlan plan = PlanMapped(ckpt);
  const std::string victim = ckpt.files().front().path;
  const std::string copy = dir.Path("replacement");
  std::filesystem::copy_file(victim, copy);
  testing::ReaderSwitch replacing([&](const std::vector<std::string>& paths,
                                      const io::ReaderOptions& options,
                                      std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    auto reader = io::OpenReader(paths, options, log);
    std::filesystem::rename(copy, victim);  // after the reader's open, before the mapping's
    return reader;
  });
  Loader loader(replacing.Options());
  LoadHandle load = loader.Load(ckpt, plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kCorruption);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains(victim) && Catch::Contains("another file is there now"));
  RequireNothingPassedOff(load, ckpt, status);
}

TEST_CASE("faults: a mapped load of a shard truncated after Open fails before mapping, no SIGBUS") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  const LoadPlan plan = PlanMapped(ckpt);
  const CheckpointFile& victim = ckpt.files().front();
  std::filesystem::resize_file(victim.path, victim.bytes / 2);
  Loader loader;
  LoadHandle load = loader.Load(ckpt, plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kCorruption);
  CHECK_THAT(std::string(status.message()), Catch::Contains(victim.path));
  CHECK_THAT(std::string(status.message()), Catch::Contains("tensor '"));
  CHECK(load.Tensors().empty());
  RequireNothingPassedOff(load, ckpt, status);
}

TEST_CASE("faults: EIO in the middle of a shard → IOError naming file, tensor, offset") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  const TensorInfo* victim = ckpt.Find("model.layers.1.attn.q.weight");
  REQUIRE(victim != nullptr);
  testing::ReaderSwitch eio([&](const std::vector<std::string>& paths,
                                const io::ReaderOptions& options,
                                std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, options, log));
    io::FaultOptions faults;
    faults.eio_at.push_back({victim->file, victim->offset + victim->nbytes / 2});
    LOADSTONE_ASSIGN_OR_RETURN(
        auto wrapped, io::FaultInjectingReader::Create(std::move(inner), paths, faults));
    return std::unique_ptr<io::Reader>(std::move(wrapped));
  });
  Loader loader(eio.Options());
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kIOError);
  const std::string msg(status.message());
  CHECK_THAT(msg, Catch::Contains(victim->name));
  CHECK_THAT(msg, Catch::Contains(ckpt.files()[victim->file].path));
  RequireNothingPassedOff(load, ckpt, status);
  eio.Off();
  RequireLoaderStillWorks(loader);
}

TEST_CASE("faults: out of memory for a destination → OutOfMemory naming the tensor") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadOptions options;
  options.host_memory_limit = ckpt.total_bytes() / 3;
  LoadHandle load = loader.Load(ckpt, *plan, options);
  const Status status = load.Done().get();
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kOutOfMemory);
  CHECK_THAT(std::string(status.message()), Catch::Contains("tensor '"));
  RequireNothingPassedOff(load, ckpt, status);
  RequireLoaderStillWorks(loader);
}

TEST_CASE("faults: stress — many concurrent loads with random cancels, slow reads or none") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.dtype = DType::kBF16;
  auto plan = Plan(ckpt, po);
  auto plain = Plan(ckpt);
  REQUIRE(plan.ok());
  REQUIRE(plain.ok());
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  LoaderOptions lo;
  lo.queue_depth = 8;
  lo.staging_bytes = 32 << 20;
  // Slow, reordered reads; or the real reader, whose page-cache views let the workers copy
  // most chunks themselves (fresh pages).
  const bool slow = GENERATE(true, false);
  testing::ReaderSwitch slow_reads([seed](const std::vector<std::string>& paths,
                                          const io::ReaderOptions& options,
                                          std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, options, log));
    io::FaultOptions faults;
    faults.latency = std::chrono::microseconds(200);
    faults.reorder_window = 4;
    faults.seed = seed;
    LOADSTONE_ASSIGN_OR_RETURN(
        auto wrapped, io::FaultInjectingReader::Create(std::move(inner), paths, faults));
    return std::unique_ptr<io::Reader>(std::move(wrapped));
  });
  if (!slow) slow_reads.Off();
  Loader loader(slow_reads.Options(lo));
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, cancelled{0}, bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int round = 0; round < 5; ++round) {
        LoadHandle load = loader.Load(ckpt, round % 2 ? *plan : *plain);
        if (rng() % 2) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 5000));
          load.Cancel();
        }
        const Status s = load.Done().get();
        if (s.ok()) {
          ++ok;
        } else if (s.code() == StatusCode::kCancelled) {
          ++cancelled;
        } else {
          ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  CHECK(ok.load() + cancelled.load() == 20);
  slow_reads.Off();
  RequireLoaderStillWorks(loader);
}

}  // namespace
}  // namespace loadstone
