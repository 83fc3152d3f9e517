// Loader end to end on generated checkpoints: bytes, casts, futures, callbacks, progress,
// backends, mmap, concurrency and cancellation.
#include "loadstone/loader.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cmath>
#include <fstream>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "test_model.h"

namespace loadstone {
namespace {

using testing::Expected;
using testing::MixedTensors;
using testing::SpecIndex;
using testing::TempDir;


float F32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// The value of element k of a source tensor, computed without loadstone's casts.
float SourceValue(DType dtype, const std::byte* p, uint64_t k) {
  switch (dtype) {
    case DType::kF32: return F32(p + 4 * k);
    case DType::kBF16: {
      uint32_t bits = static_cast<uint32_t>(uint8_t(p[2 * k])) |
                      static_cast<uint32_t>(uint8_t(p[2 * k + 1])) << 8;
      bits <<= 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kF16: {
      _Float16 h;
      std::memcpy(&h, p + 2 * k, 2);
      return static_cast<float>(h);
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, p + 8 * k, 8);
      return static_cast<float>(d);
    }
    default: FAIL("no oracle for this dtype"); return 0;
  }
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

TEST_CASE("loader: every tensor lands byte-exact, futures and callbacks fire once") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  REQUIRE(ckpt.files().size() > 1);
  const auto backend = GENERATE(ReadBackend::kAuto, ReadBackend::kPread);
  const bool align_tensors = GENERATE(false, true);
  const bool fresh_pages = GENERATE(true, false);
  PlanOptions po;
  po.routes.fill_fresh_pages = fresh_pages;
  po.routes.align_tensors = align_tensors;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  LoaderOptions lo;
  lo.backend = backend;
  Loader loader(lo);
  std::mutex mu;
  std::multiset<std::string> seen;
  LoadOptions options;
  options.on_tensor = [&](const Tensor& t) {
    std::lock_guard lock(mu);
    seen.insert(t.name());
  };
  LoadHandle load = loader.Load(ckpt, *plan, options);
  const Tensor& first = load.Tensor("model.layers.0.attn.q.weight").get();
  testing::CheckTensorBytes(first);
  REQUIRE(load.Done().get().ok());
  INFO("backend: " << load.backend());
  CHECK_FALSE(load.backend().empty());
  // Where the kernel has userfaultfd, large CPU tensors are filled as fresh pages; the backend
  // line says which way it went.
  const bool filled = load.backend().find("fresh pages by the workers") != std::string::npos;
  if (!fresh_pages) CHECK_FALSE(filled);
  if (fresh_pages && !filled) WARN("fresh pages unavailable: " << load.backend());
  const auto tensors = load.Tensors();
  REQUIRE(tensors.size() == ckpt.tensors().size());
  for (const Tensor& t : tensors) {
    INFO(t.name());
    testing::CheckTensorBytes(t);
    CHECK(t.device() == "cpu");
    const auto address = reinterpret_cast<uintptr_t>(t.data());
    const uint64_t offset = ckpt.Find(t.name())->offset;
    const bool small = t.nbytes() < (1 << 20);  // PlanOptions::coalesce_below
    if (align_tensors) {
      CHECK(address % 64 == 0);
    } else if (filled && !small) {  // a mapping of its own
      CHECK(address % 4096 == 0);
    } else if (!small) {  // in phase with the file, so that O_DIRECT lands in place
      CHECK(address % 4096 == offset % 4096);
    }
    CHECK(seen.count(t.name()) == 1);
  }
  CHECK(seen.size() == ckpt.tensors().size());
  // Small unconverted tensors share their read's buffer, laid out as in the file: within one
  // read, every tensor's address minus its file offset is the same; unless 64-byte alignment was
  // asked for, when nothing shares a read's buffer.
  size_t shared_reads = 0;
  for (const ReadChunk& r : plan->reads) {
    if (!r.shared_buffer) continue;
    ++shared_reads;
    std::set<intptr_t> bases;
    for (uint32_t i : r.tensors) {
      const TensorInfo& src = ckpt.tensors()[plan->tensors[i].source];
      bases.insert(reinterpret_cast<intptr_t>(load.Tensor(src.name).get().data()) -
                   static_cast<intptr_t>(src.offset));
    }
    CHECK(bases.size() == 1);
  }
  CHECK((shared_reads > 0) == !align_tensors);
  const Progress p = load.progress();
  CHECK(p.bytes_read == ckpt.total_bytes());
  CHECK(p.bytes_placed == ckpt.total_bytes());
  CHECK(p.tensors_done == p.tensors_total);
  // The files were just written (in the page cache): with fresh pages, the workers copied the
  // large tensors out of the cache themselves, without reads.
  const RouteCount copied = load.read_stats().taken(ReadRoute::kPageCacheCopy);
  if (filled) CHECK(copied.bytes > 0);
  if (!filled) CHECK(copied.bytes == 0);
  // Every read took a route, and each route's bytes add up to the plan's.
  uint64_t reads = 0, bytes = 0;
  for (const RouteCount& c : load.read_stats().routes) reads += c.reads, bytes += c.bytes;
  CHECK(reads == plan->reads.size());
  CHECK(bytes == plan->read_bytes);
  // Routes named two ways are settled at each read's turn: none is reported as taken.
  CHECK(load.read_stats().taken(ReadRoute::kStagedWhenCold).reads == 0);
  CHECK(load.read_stats().taken(ReadRoute::kFreshPages).reads == 0);
  CHECK_THROWS_AS(load.Tensor("no.such.tensor").get(), Error);
}

// In a child whose seccomp filter refuses userfaultfd (as container runtimes may): the load
// says that fresh pages are unavailable and writes its tensors the ordinary way. Exit codes:
// 0 fine, 2 no seccomp, 3 the load failed, 4 the backend line, 5 wrong bytes.
int LoadWithoutUserfaultfd(const Checkpoint& ckpt, const LoadPlan& plan) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    return 2;
  }
  Loader loader;  // ReadRouteOptions::fill_fresh_pages is on by default
  LoadHandle load = loader.Load(ckpt, plan);
  if (!load.Done().get().ok()) return 3;
  if (load.backend().find("fresh pages unavailable") == std::string::npos ||
      load.backend().find("Operation not permitted") == std::string::npos) {
    return 4;
  }
  for (const Tensor& t : load.Tensors()) {
    const size_t i = SpecIndex(t.name());
    const std::vector<std::byte> expected = Expected(i, MixedTensors()[i]);
    if (t.nbytes() != expected.size() ||
        (!expected.empty() && std::memcmp(t.data(), expected.data(), expected.size()) != 0)) {
      return 5;
    }
  }
  return 0;
}

TEST_CASE("loader: without userfaultfd the load says so and places tensors the ordinary way") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(LoadWithoutUserfaultfd(ckpt, *plan));
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) {
    WARN("seccomp filters unavailable here: skipped");
    return;
  }
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("loader: a cast to f32 matches independent conversions, integers stay") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.dtype = DType::kF32;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  for (const Tensor& t : load.Tensors()) {
    INFO(t.name());
    const size_t i = SpecIndex(t.name());
    const auto spec = MixedTensors()[i];
    const auto src = Expected(i, spec);
    if (!IsFloatingPoint(spec.dtype) || spec.dtype == DType::kF8E4M3) {
      if (spec.dtype != DType::kF8E4M3) testing::CheckTensorBytes(t);
      continue;
    }
    REQUIRE(t.dtype() == DType::kF32);
    uint64_t numel = 1;
    for (uint64_t d : spec.shape) numel *= d;
    REQUIRE(t.nbytes() == numel * 4);
    uint64_t mismatches = 0;
    for (uint64_t k = 0; k < numel; ++k) {
      mismatches += !SameFloat(F32(t.data() + 4 * k), SourceValue(spec.dtype, src.data(), k));
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("loader: mmap mode maps unconverted tensors") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.routes.mmap = true;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  REQUIRE(load.Done().get().ok());
  for (const Tensor& t : load.Tensors()) testing::CheckTensorBytes(t);
  // Every unconverted CPU tensor is mapped, small ones included (nothing to coalesce): no read.
  for (const ReadChunk& r : plan->reads) CHECK(r.route == ReadRoute::kMapped);
  const ReadStats rs = load.read_stats();
  const Progress p = load.progress();
  CHECK(rs.taken(ReadRoute::kMapped).bytes == plan->read_bytes);
  CHECK(rs.taken(ReadRoute::kMapped).reads == plan->reads.size());
  CHECK(p.bytes_read == 0);
  // Mapped tensors point into the file's mapping: their bytes are the file's.
  for (const Tensor& t : load.Tensors()) CHECK(t.data() != nullptr);
  CHECK(p.bytes_placed == plan->placed_bytes);
}

TEST_CASE("loader: several loads at once on one Loader") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  PlanOptions half;
  half.dtype = DType::kF16;
  auto plan16 = Plan(ckpt, half);
  REQUIRE(plan.ok());
  REQUIRE(plan16.ok());
  Loader loader;
  std::vector<LoadHandle> loads;
  for (int i = 0; i < 6; ++i) loads.push_back(loader.Load(ckpt, i % 2 ? *plan16 : *plan));
  for (auto& load : loads) REQUIRE(load.Done().get().ok());
  for (const Tensor& t : loads[0].Tensors()) testing::CheckTensorBytes(t);
}

TEST_CASE("loader: cancel at random points, the Loader keeps working") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.dtype = DType::kF32;
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  LoaderOptions lo;
  lo.queue_depth = 4;
  Loader loader(lo);
  for (int round = 0; round < 20; ++round) {
    LoadHandle load = loader.Load(ckpt, *plan);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    load.Cancel();
    const Status status = load.Done().get();
    CHECK((status.ok() || status.code() == StatusCode::kCancelled));
    const Progress p = load.progress();
    if (!status.ok()) {
      CHECK(load.Tensors().empty());
      // Tensors that were not in place hold the Cancelled error; the rest are whole.
      for (const TensorPlan& tp : plan->tensors) {
        auto future = load.Tensor(ckpt.tensors()[tp.source].name);
        uint64_t got = 0;
        StatusCode code = StatusCode::kOk;
        try {
          got = future.get().nbytes();
        } catch (const Error& e) {
          code = e.status().code();
        }
        CHECK((code == StatusCode::kCancelled || got == tp.nbytes));
      }
      CHECK(p.tensors_done < p.tensors_total);
    }
  }
  LoadHandle again = loader.Load(ckpt, *plan);
  CHECK(again.Done().get().ok());
}

TEST_CASE("loader: destroying a handle mid-load cancels and waits") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  REQUIRE(plan.ok());
  Loader loader;
  for (int i = 0; i < 10; ++i) {
    LoadHandle load = loader.Load(ckpt, *plan);
  }
  LoadHandle moved = loader.Load(ckpt, *plan);
  LoadHandle other = std::move(moved);
  REQUIRE(other.Done().get().ok());
}

TEST_CASE("loader: OnTensor registered late still sees every tensor once") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  auto plan = Plan(ckpt);
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  std::atomic<size_t> calls{0};
  REQUIRE(load.OnTensor([&](const Tensor&) { ++calls; }).ok());
  REQUIRE(load.Done().get().ok());
  CHECK(calls.load() == ckpt.tensors().size());
}

TEST_CASE("loader: an empty checkpoint finishes at once") {
  TempDir dir;
  REQUIRE(WriteSafetensors(dir.Path("e.safetensors"), {}).ok());
  auto ckpt = Checkpoint::Open(dir.Path("e.safetensors"));
  REQUIRE(ckpt.ok());
  auto plan = Plan(*ckpt);
  Loader loader;
  LoadHandle load = loader.Load(*ckpt, *plan);
  CHECK(load.Done().get().ok());
  CHECK(load.Tensors().empty());
}

TEST_CASE("loader: the trace holds reads, conversions and tensor events") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  PlanOptions po;
  po.dtype = DType::kBF16;
  auto plan = Plan(ckpt, po);
  Loader loader;
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  const std::string text = testing::TraceText(load, dir);
  CHECK_THAT(text, Catch::Contains("\"cat\":\"read\""));
  CHECK_THAT(text, Catch::Contains("\"cat\":\"convert\""));
  CHECK_THAT(text, Catch::Contains("ready model.norm.weight"));
}

}  // namespace
}  // namespace loadstone
