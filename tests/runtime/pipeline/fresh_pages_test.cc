// FreshPages: memory filled by UFFDIO_COPY instead of fault-zero-copy.
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstring>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/pipeline/fresh_pages.h"

namespace loadstone::pipeline {
namespace {

constexpr uint64_t kPage = 4096;

std::unique_ptr<FreshPages> OpenOrSkip() {
  auto fresh = FreshPages::Open();
  if (!fresh.ok()) WARN("userfaultfd unavailable here, skipped: " << fresh.status().ToString());
  return fresh.ok() ? std::move(*fresh) : nullptr;
}

std::vector<std::byte> Pattern(uint64_t bytes, uint32_t seed) {
  std::vector<std::byte> out(bytes);
  uint32_t x = seed;
  for (auto& b : out) b = std::byte(static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24));
  return out;
}

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

TEST_CASE("fresh pages: unaligned ranges and shared pages land byte-exact") {
  auto fresh = OpenOrSkip();
  if (!fresh) return;
  const uint64_t bytes = 40 * kPage + 123;
  auto buffer = fresh->Allocate(bytes, nullptr);
  REQUIRE(buffer.ok());
  std::byte* data = buffer->get();
  REQUIRE(reinterpret_cast<uintptr_t>(data) % kPage == 0);
  const auto want = Pattern(bytes, 7);
  // Pieces cut mid-page, written from unaligned sources by two threads at once, so that the
  // pages two pieces share are filled concurrently.
  const std::vector<uint64_t> cuts = {0, 100, 3 * kPage + 5, 3 * kPage + 9, 17 * kPage,
                                      17 * kPage + kPage / 2, 39 * kPage + 1, bytes};
  std::vector<std::byte> source(bytes + 3);
  std::memcpy(source.data() + 3, want.data(), bytes);  // 3: sources are not page-aligned
  std::vector<Status> results(cuts.size() - 1);
  auto write = [&](size_t parity) {
    for (size_t k = parity; k + 1 < cuts.size(); k += 2) {
      results[k] = fresh->Write(data + cuts[k], source.data() + 3 + cuts[k], cuts[k + 1] - cuts[k]);
    }
  };
  std::thread other(write, 1);
  write(0);
  other.join();
  for (const Status& s : results) CHECK(s.ok());
  CHECK(std::memcmp(data, want.data(), bytes) == 0);
}

TEST_CASE("fresh pages: whole pages go in without a page fault each") {
  auto fresh = OpenOrSkip();
  if (!fresh) return;
  const uint64_t bytes = 64ULL << 20;
  auto buffer = fresh->Allocate(bytes, nullptr);
  REQUIRE(buffer.ok());
  const auto source = Pattern(bytes, 3);
  const long before = MinorFaults();
  REQUIRE(fresh->Write(buffer->get(), source.data(), bytes).ok());
  const long faults = MinorFaults() - before;
  INFO(faults << " minor faults for " << bytes / kPage << " pages");
  CHECK(faults < static_cast<long>(bytes / kPage / 16));  // written by memcpy: one per page
  CHECK(std::memcmp(buffer->get(), source.data(), bytes) == 0);
}

TEST_CASE("fresh pages: converted blocks, budget, and memory that outlives the filler") {
  auto fresh = OpenOrSkip();
  if (!fresh) return;
  auto budget = std::make_shared<HostMemoryBudget>(16 * kPage);
  CHECK(fresh->Allocate(17 * kPage, budget).status().code() == StatusCode::kOutOfMemory);
  CHECK(budget->used() == 0);
  const uint64_t bytes = 2 * FreshPages::kScratchBytes + 3 * kPage + 16;  // several blocks
  auto buffer = fresh->Allocate(bytes + kPage, nullptr);
  REQUIRE(buffer.ok());
  std::byte* dst = buffer->get() + 64;  // starts mid-page, as a later chunk of a tensor may
  std::vector<uint64_t> offsets;
  auto produce = [&](std::byte* out, uint64_t offset, uint64_t n) {
    offsets.push_back(offset);
    for (uint64_t i = 0; i < n; ++i) out[i] = std::byte(static_cast<uint8_t>((offset + i) % 251));
    return Status::OK();
  };
  REQUIRE(fresh->WriteConverted(dst, bytes, produce).ok());
  REQUIRE(offsets.size() >= 3);
  for (size_t k = 1; k < offsets.size(); ++k) CHECK((64 + offsets[k]) % kPage == 0);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (dst[i] != std::byte(static_cast<uint8_t>(i % 251))) FAIL("byte " << i);
  }
  // A producer's error comes back as is.
  auto failing = [](std::byte*, uint64_t, uint64_t) { return Status::Corruption("bad block"); };
  auto other = fresh->Allocate(kPage, nullptr);
  REQUIRE(other.ok());
  CHECK(fresh->WriteConverted(other->get(), kPage, failing).code() == StatusCode::kCorruption);
  // Once the filler is gone its pages are ordinary memory: an unfilled one reads as zeros (it
  // does not wait), and the filled ones keep their bytes.
  fresh.reset();
  CHECK(other->get()[100] == std::byte{0});
  other->get()[100] = std::byte{9};
  CHECK(other->get()[100] == std::byte{9});
  CHECK(dst[bytes - 1] == std::byte(static_cast<uint8_t>((bytes - 1) % 251)));
}

TEST_CASE("fresh pages: an unreadable source is an IOError, not a crash") {
  auto fresh = OpenOrSkip();
  if (!fresh) return;
  auto buffer = fresh->Allocate(4 * kPage, nullptr);
  REQUIRE(buffer.ok());
  void* hole = ::mmap(nullptr, 4 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(hole != MAP_FAILED);
  const Status s = fresh->Write(buffer->get(), static_cast<const std::byte*>(hole), 4 * kPage);
  ::munmap(hole, 4 * kPage);
  CHECK(s.code() == StatusCode::kIOError);
  CHECK_THAT(std::string(s.message()), Catch::Contains("Bad address"));
}

}  // namespace
}  // namespace loadstone::pipeline
