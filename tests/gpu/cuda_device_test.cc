// CudaDevice on a real GPU: allocation, staging, Submit (copies and conversions) in order,
// done exactly once, errors, backpressure on scratch slots, staging reuse from inside done,
// concurrent Submit, Drain and the destructor with jobs in flight. Skips without a GPU.
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cuda/cuda_device.h"
#include "gpu_test_util.h"
#include "runtime/convert/cast.h"

namespace loadstone::cuda {
namespace {

using device::DeviceMemory;
using device::HostStaging;
using device::PlaceJob;

std::shared_ptr<CudaDevice> OpenOrFail(CudaDeviceOptions options = {}) {
  auto d = CudaDevice::Open(0, options);
  REQUIRE(d.ok());
  return *std::move(d);
}

void FillRandom(std::byte* p, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(p + i, &x, std::min<uint64_t>(8, n - i));
  }
}

// Records the order and the status of done calls.
struct Completions {
  std::mutex mu;
  std::vector<int> order;
  std::vector<Status> statuses;
  std::function<void(Status)> Make(int id) {
    return [this, id](Status s) {
      std::lock_guard lk(mu);
      order.push_back(id);
      statuses.push_back(std::move(s));
    };
  }
};

TEST_CASE("cuda device: info, allocate, staging, absurd allocation") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  auto dev = OpenOrFail();
  const auto info = dev->Info();
  CHECK(info.name == "cuda:0");
  CHECK(info.total_bytes > 0);
  CHECK(info.free_bytes > 0);
  CHECK(info.free_bytes <= info.total_bytes);
  auto mem = dev->Allocate(1 << 20);
  REQUIRE(mem.ok());
  CHECK(mem->data != nullptr);
  auto staging = dev->AllocateStaging(64 << 20);
  REQUIRE(staging.ok());
  CHECK(staging->pinned);  // the GPU check runs as root: no memlock limit
  if (!staging->pinned) WARN("staging pageable: " << dev->StagingNote());
  CHECK(reinterpret_cast<uintptr_t>(staging->data.get()) % 4096 == 0);
  auto absurd = dev->Allocate(uint64_t{1} << 60);
  REQUIRE_FALSE(absurd.ok());
  CHECK(absurd.status().code() == StatusCode::kOutOfMemory);
  CHECK(std::string(absurd.status().message()).find("cuda:0") != std::string::npos);
  // The device still works after the failed allocation.
  CHECK(dev->Allocate(1 << 20).ok());
}

TEST_CASE("cuda device: copies and conversions complete in order, once, with the right bits") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  auto dev = OpenOrFail({.scratch_slots = 2, .scratch_slot_bytes = 1 << 20});
  struct Case { DType from, to; uint64_t count; };
  const Case cases[] = {{DType::kBF16, DType::kBF16, 3 << 20}, {DType::kBF16, DType::kF16, 1 << 20},
                        {DType::kF32, DType::kBF16, 777777}, {DType::kF8E4M3, DType::kBF16, 4097},
                        {DType::kF16, DType::kF32, 5 << 20}, {DType::kU8, DType::kU8, 13},
                        {DType::kF64, DType::kF16, 100001}, {DType::kF8E5M2, DType::kF32, 1}};
  constexpr int kJobs = 48;
  std::vector<HostStaging> staging;
  std::vector<DeviceMemory> dst;
  std::vector<std::vector<std::byte>> expect;
  Completions c;
  for (int i = 0; i < kJobs; ++i) {
    const Case& k = cases[i % std::size(cases)];
    const uint64_t in = convert::ElementBytes(k.from, k.count);
    const uint64_t out = convert::ElementBytes(k.to, k.count);
    auto s = dev->AllocateStaging(in);
    auto d = dev->Allocate(out);
    REQUIRE(s.ok());
    REQUIRE(d.ok());
    FillRandom(s->data.get(), in, static_cast<uint64_t>(i));
    std::vector<std::byte> e(out);
    REQUIRE(convert::CastBuffer(k.from, k.to, s->data.get(), e.data(), k.count).ok());
    PlaceJob job{.src = s->data.get(), .bytes = in, .dst = d->data, .from = k.from, .to = k.to,
                 .count = k.count, .done = c.Make(i)};
    dev->Submit(std::move(job));
    staging.push_back(*std::move(s));
    dst.push_back(*std::move(d));
    expect.push_back(std::move(e));
  }
  dev->Drain();
  REQUIRE(c.order.size() == kJobs);
  for (int i = 0; i < kJobs; ++i) {
    CHECK(c.order[i] == i);
    CHECK(c.statuses[i].ok());
    std::vector<std::byte> got(expect[i].size());
    REQUIRE(dev->CopyToHost(dst[i].data, got.size(), got.data()).ok());
    CHECK(got == expect[i]);
  }
}

TEST_CASE("cuda device: bad jobs complete with InvalidArgument, in order with the good ones") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  auto dev = OpenOrFail();
  auto s = dev->AllocateStaging(4096);
  auto d = dev->Allocate(4096);
  REQUIRE(s.ok());
  REQUIRE(d.ok());
  Completions c;
  auto job = [&](int id) {
    return PlaceJob{.src = s->data.get(), .bytes = 4096, .dst = d->data, .done = c.Make(id)};
  };
  dev->Submit(job(0));
  PlaceJob unsupported = job(1);
  unsupported.from = DType::kI32;
  unsupported.to = DType::kF32;
  unsupported.count = 1024;
  dev->Submit(std::move(unsupported));
  PlaceJob null_src = job(2);
  null_src.src = nullptr;
  dev->Submit(std::move(null_src));
  PlaceJob wrong_bytes = job(3);
  wrong_bytes.from = DType::kF32;
  wrong_bytes.to = DType::kBF16;
  wrong_bytes.count = 1000;  // 4000 bytes, not 4096
  dev->Submit(std::move(wrong_bytes));
  dev->Submit(job(4));
  dev->Drain();
  REQUIRE(c.order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(c.statuses[0].ok());
  CHECK(c.statuses[1].code() == StatusCode::kInvalidArgument);
  CHECK(c.statuses[2].code() == StatusCode::kInvalidArgument);
  CHECK(c.statuses[3].code() == StatusCode::kInvalidArgument);
  CHECK(c.statuses[4].ok());
}

TEST_CASE("cuda device: staging is reusable when done runs (next job submitted from done)") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  auto dev = OpenOrFail({.scratch_slots = 1, .scratch_slot_bytes = 1 << 20});
  constexpr int kRounds = 32;
  constexpr uint64_t kCount = 1 << 20;  // f32 -> bf16, 4 MiB in: the slot grows once
  auto s = dev->AllocateStaging(kCount * 4);
  auto d = dev->Allocate(kRounds * kCount * 2);
  REQUIRE(s.ok());
  REQUIRE(d.ok());
  std::vector<std::byte> expect(kRounds * kCount * 2);
  std::atomic<int> failures{0};
  std::function<void(int)> submit = [&](int round) {
    FillRandom(s->data.get(), kCount * 4, 1000 + round);  // overwrite: the last job is done
    REQUIRE(convert::CastBuffer(DType::kF32, DType::kBF16, s->data.get(),
                                expect.data() + round * kCount * 2, kCount).ok());
    dev->Submit(PlaceJob{.src = s->data.get(), .bytes = kCount * 4,
                         .dst = d->data + round * kCount * 2, .from = DType::kF32,
                         .to = DType::kBF16, .count = kCount, .done = [&, round](Status st) {
                           if (!st.ok()) ++failures;
                           if (round + 1 < kRounds) submit(round + 1);
                         }});
  };
  submit(0);
  // Drain sees the queue empty only after the last round (each done submits the next first).
  dev->Drain();
  CHECK(failures == 0);
  std::vector<std::byte> got(expect.size());
  REQUIRE(dev->CopyToHost(d->data, got.size(), got.data()).ok());
  CHECK(got == expect);
}

TEST_CASE("cuda device: concurrent Submit keeps each thread's order, destructor drains") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  constexpr int kThreads = 4, kPerThread = 50;
  constexpr uint64_t kBytes = 256 << 10;
  std::vector<std::vector<int>> seen(kThreads);
  std::mutex mu;
  std::atomic<int> calls{0};
  std::vector<HostStaging> staging;
  std::vector<DeviceMemory> dst;
  {
    auto dev = OpenOrFail({.scratch_slots = 2});
    for (int t = 0; t < kThreads; ++t) {
      auto s = dev->AllocateStaging(kBytes);
      auto d = dev->Allocate(kBytes / 2 * kPerThread);
      REQUIRE(s.ok());
      REQUIRE(d.ok());
      staging.push_back(*std::move(s));
      dst.push_back(*std::move(d));
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const bool convert = i % 2 == 1;
          dev->Submit(PlaceJob{.src = staging[t].data.get(),
                               .bytes = convert ? kBytes : kBytes / 2,
                               .dst = dst[t].data + i * (kBytes / 2),
                               .from = convert ? DType::kF32 : DType::kBF16,
                               .to = DType::kBF16, .count = kBytes / 4,
                               .done = [&, t, i](Status st) {
                                 CHECK(st.ok());
                                 ++calls;
                                 std::lock_guard lk(mu);
                                 seen[t].push_back(i);
                               }});
        }
      });
    }
    for (auto& th : threads) th.join();
    // dev goes out of scope with jobs in flight: the destructor waits for all of them.
  }
  CHECK(calls == kThreads * kPerThread);
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(seen[t].size() == kPerThread);
    for (int i = 0; i < kPerThread; ++i) CHECK(seen[t][i] == i);
  }
}

TEST_CASE("cuda device: Submit does not block while conversions wait for a scratch slot") {
  LOADSTONE_SKIP_WITHOUT_GPU();
  auto dev = OpenOrFail({.scratch_slots = 1, .scratch_slot_bytes = 64 << 20});
  constexpr uint64_t kCount = 16 << 20;  // 64 MiB of f32 per job
  auto s = dev->AllocateStaging(kCount * 4);
  auto d = dev->Allocate(kCount * 2);
  REQUIRE(s.ok());
  REQUIRE(d.ok());
  std::atomic<int> ok{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 16; ++i) {
    dev->Submit(PlaceJob{.src = s->data.get(), .bytes = kCount * 4, .dst = d->data,
                         .from = DType::kF32, .to = DType::kBF16, .count = kCount,
                         .done = [&](Status st) { ok += st.ok(); }});
  }
  const auto submit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  dev->Drain();
  const auto total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ok == 16);
  // 1 GiB through one slot takes tens of milliseconds; queueing it takes microseconds.
  CHECK(submit_s < total_s / 4);
  WARN("16 x 64 MiB f32->bf16 through one slot: " << total_s * 1e3 << " ms, "
       << 16.0 * kCount * 4 / total_s / 1e9 << " GB/s of input (pinned: " << s->pinned << ")");
}

}  // namespace
}  // namespace loadstone::cuda
