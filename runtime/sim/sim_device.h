// A simulated accelerator: "device" memory is host memory, jobs run in order on a thread of
// its own with an optional latency and bandwidth cap, conversions use the CPU reference casts.
// It lets CI test ordering, backpressure, staging recycling, multi-device routing,
// cancellation and faults without a GPU.
#ifndef LOADSTONE_RUNTIME_SIM_SIM_DEVICE_H_
#define LOADSTONE_RUNTIME_SIM_SIM_DEVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "runtime/device/accelerator.h"

namespace loadstone::device {

struct SimDeviceOptions {
  std::string name = "cuda:0";
  uint64_t memory_bytes = 1ULL << 30;           // Allocate fails past this
  std::chrono::microseconds latency{0};         // per job
  double bandwidth_bytes_per_s = 0;             // 0: unlimited
  int64_t fail_job = -1;                        // the job with this sequence number fails (IOError)
  // Decodes quantized weights itself (DecodesQuantized); false: as a device without those
  // kernels, which has the load's workers decode them.
  bool decodes_quantized = true;
};

class SimDevice final : public Accelerator {
 public:
  explicit SimDevice(SimDeviceOptions options);
  ~SimDevice() override;  // drains

  DeviceInfo Info() const override;
  Result<DeviceMemory> Allocate(uint64_t bytes) override;
  Result<HostStaging> AllocateStaging(uint64_t bytes) override;
  bool CanConvert(DType from, DType to) const override;
  bool CanDequantFp8Block(DType from, DType to) const override;
  // With the CPU references, the quant state read from the job's device addresses (unless
  // SimDeviceOptions::decodes_quantized is false).
  bool DecodesQuantized() const override { return options_.decodes_quantized; }
  void Submit(PlaceJob job) override;
  Status CopyToHost(const std::byte* device_src, uint64_t bytes, std::byte* host_dst) override;
  void Drain() override;

  // For tests: jobs run so far, the most jobs queued at once, bytes allocated now and at most,
  // staging bytes handed out.
  uint64_t jobs_done() const { return jobs_done_.load(); }
  size_t max_queued() const { return max_queued_.load(); }
  uint64_t allocated_bytes() const { return allocated_.load(); }
  uint64_t peak_allocated_bytes() const { return peak_allocated_.load(); }
  uint64_t staging_bytes() const { return staging_.load(); }

 private:
  void Run();
  Status Execute(const PlaceJob& job, JobTiming* timing);
  Status Place(const PlaceJob& job);  // the copy or conversion itself

  const SimDeviceOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PlaceJob> queue_;  // guarded by mu_
  size_t running_ = 0;          // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  int64_t submitted_ = 0;       // guarded by mu_
  std::atomic<uint64_t> jobs_done_{0};
  std::atomic<size_t> max_queued_{0};
  std::shared_ptr<std::atomic<uint64_t>> allocated_counter_;
  std::atomic<uint64_t>& allocated_;
  std::atomic<uint64_t> peak_allocated_{0};
  std::atomic<uint64_t> staging_{0};
  std::thread thread_;  // last: started after everything above exists
};

}  // namespace loadstone::device

#endif  // LOADSTONE_RUNTIME_SIM_SIM_DEVICE_H_
