#include "runtime/sim/sim_device.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "runtime/convert/cast.h"
#include "runtime/convert/bitsandbytes.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/convert/packed_int.h"

namespace loadstone::device {

SimDevice::SimDevice(SimDeviceOptions options)
    : options_(std::move(options)),
      allocated_counter_(std::make_shared<std::atomic<uint64_t>>(0)),
      allocated_(*allocated_counter_),
      thread_([this] { Run(); }) {}

SimDevice::~SimDevice() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

DeviceInfo SimDevice::Info() const {
  const uint64_t used = allocated_.load();
  return {options_.name, options_.memory_bytes, options_.memory_bytes - std::min(used, options_.memory_bytes),
          fmt::format("simulated ({} us/job, {} B/s)", options_.latency.count(),
                      options_.bandwidth_bytes_per_s)};
}

Result<DeviceMemory> SimDevice::Allocate(uint64_t bytes) {
  uint64_t used = allocated_.load();
  do {
    if (used + bytes > options_.memory_bytes) {
      return Status::OutOfMemory(fmt::format("{}: cannot allocate {} bytes ({} of {} in use)",
                                             options_.name, bytes, used, options_.memory_bytes));
    }
  } while (!allocated_.compare_exchange_weak(used, used + bytes));
  uint64_t peak = peak_allocated_.load();
  while (used + bytes > peak && !peak_allocated_.compare_exchange_weak(peak, used + bytes)) {
  }
  void* p = std::malloc(std::max<uint64_t>(bytes, 1));
  if (p == nullptr) {
    allocated_ -= bytes;
    return Status::OutOfMemory(fmt::format("{}: host malloc of {} bytes failed", options_.name, bytes));
  }
  DeviceMemory memory;
  memory.owner = std::shared_ptr<void>(p, [counter = allocated_counter_, bytes](void* q) {
    std::free(q);
    *counter -= bytes;
  });
  memory.data = static_cast<std::byte*>(p);
  memory.bytes = bytes;
  return memory;
}

Result<HostStaging> SimDevice::AllocateStaging(uint64_t bytes) {
  void* p = std::aligned_alloc(4096, (std::max<uint64_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (p == nullptr) return Status::OutOfMemory(fmt::format("staging of {} bytes", bytes));
  staging_ += bytes;
  HostStaging staging;
  staging.data = std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
  staging.bytes = bytes;
  staging.pinned = false;
  staging.why_pageable = "a simulated device: host memory, nothing to pin";
  staging.simulated = true;
  return staging;
}

bool SimDevice::CanConvert(DType from, DType to) const { return convert::CanCast(from, to); }
bool SimDevice::CanDequantFp8Block(DType from, DType to) const {
  return convert::CanDequantFp8Block(from, to);
}

void SimDevice::Submit(PlaceJob job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
    max_queued_ = std::max(max_queued_.load(), queue_.size());
  }
  cv_.notify_all();
}

Status SimDevice::Execute(const PlaceJob& job, JobTiming* timing) {
  // The simulated transfer is the latency and bandwidth wait; the conversion is the "kernel".
  timing->copy_begin = std::chrono::steady_clock::now();
  if (options_.latency.count() > 0) std::this_thread::sleep_for(options_.latency);
  if (options_.bandwidth_bytes_per_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(job.bytes / options_.bandwidth_bytes_per_s));
  }
  timing->copy_end = timing->kernel_begin = std::chrono::steady_clock::now();
  const Status status = Place(job);
  timing->kernel_end = Converts(job) ? std::chrono::steady_clock::now() : timing->kernel_begin;
  return status;
}

namespace {

// A quantized piece decoded by the CPU reference with the quant state the job points at — its
// "device" copy, host memory here — so that what the pipeline uploaded is what decodes.
Status DecodeQuantized(const PlaceJob& job) {
  const QuantDecode& q = *job.quant;
  switch (q.conversion) {
    case Conversion::kDequantPackedInt: {
      PackedIntState s = *q.layout.packed_int;
      if (!s.zeros.empty()) s.zeros.assign(q.zeros, q.zeros + s.zeros.size());
      if (!s.g_idx.empty()) s.g_idx.assign(q.g_idx, q.g_idx + s.g_idx.size());
      return convert::DequantPackedInt(s, job.to, job.src, convert::WordOf(s, job.first),
                                       job.first, job.count, q.scales, job.dst);
    }
    case Conversion::kDequantBnb4: {
      auto state = std::make_shared<Bnb4State>(*q.layout.bnb4);
      if (state->nested) {
        std::copy(q.nested_code, q.nested_code + state->nested_code.size(),
                  state->nested_code.begin());
        state->nested_absmax.assign(q.nested_absmax,
                                    q.nested_absmax + state->nested_absmax.size());
      }
      PackedLayout layout = q.layout;
      layout.bnb4 = std::move(state);
      return convert::DequantBnb4(layout, job.to, job.src, job.first, job.count, q.scales,
                                  job.dst);
    }
    case Conversion::kDequantBnb8:
      return convert::DequantBnbInt8(job.to, job.src, job.first, job.count, q.int8_cols, q.scales,
                                     job.dst);
    case Conversion::kDequantBlocks: {
      const convert::GgufBlockType* type = convert::FindGgufBlockType(q.layout.scheme);
      if (type == nullptr) break;
      return convert::DequantGgufBlocks(q.layout.scheme, job.to, job.src, job.dst,
                                        job.count / type->block_elems);
    }
    default:
      break;
  }
  return Status::InvalidArgument(
      fmt::format("a quantized job of {} weights the device cannot decode", q.layout.scheme));
}

}  // namespace

Status SimDevice::Place(const PlaceJob& job) {
  if (job.quant != nullptr) return DecodeQuantized(job);
  if (job.fp8.scales != nullptr) {
    return convert::DequantFp8Block(job.from, job.to, job.src, job.dst, job.first, job.count,
                                    job.fp8);
  }
  if (job.from == job.to) {
    if (job.bytes) std::memcpy(job.dst, job.src, job.bytes);
    return Status::OK();
  }
  return convert::CastBuffer(job.from, job.to, job.src, job.dst, job.count);
}

void SimDevice::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    PlaceJob job = std::move(queue_.front());
    queue_.pop_front();
    const int64_t sequence = submitted_++;
    ++running_;
    lock.unlock();
    {
      JobTiming timing;
      Status status = sequence == options_.fail_job
                          ? Status::IOError(fmt::format("{}: injected failure of job {}",
                                                        options_.name, sequence))
                          : Execute(job, &timing);
      ++jobs_done_;
      if (status.ok() && job.timed) job.timed(timing);
      job.done(std::move(status));
      job = PlaceJob();  // let go of the callback (and what it holds) before Drain can return
    }
    lock.lock();
    --running_;
    cv_.notify_all();
  }
}

Status SimDevice::CopyToHost(const std::byte* device_src, uint64_t bytes, std::byte* host_dst) {
  if (bytes) std::memcpy(host_dst, device_src, bytes);
  return Status::OK();
}

void SimDevice::Drain() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
}

}  // namespace loadstone::device
