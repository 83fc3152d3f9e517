// Accelerator: what the pipeline needs from a device that is not the CPU, and nothing more. The CUDA backend
// (cuda/) and the simulated device (runtime/sim/sim_device.h) implement it; the pipeline
// never includes a CUDA header.
//
// Work is submitted as PlaceJobs: copy `bytes` from host staging memory to the device, either
// straight into the destination or into device scratch followed by a conversion kernel that
// writes the destination. The device calls `done` once the job finished on the device, from a
// thread of its own — at that point the host staging memory may be reused. Jobs on one device
// may complete out of submission order only if the implementation says so; both
// implementations here complete them in order.
//
// Thread safety: every method may be called from any thread.
#ifndef LOADSTONE_RUNTIME_DEVICE_ACCELERATOR_H_
#define LOADSTONE_RUNTIME_DEVICE_ACCELERATOR_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::device {

// Device memory: `data` is a device address (never dereferenced by the host); freed when the
// last owner goes. Outlives every job that writes it (the pipeline keeps it alive).
struct DeviceMemory {
  std::shared_ptr<void> owner;
  std::byte* data = nullptr;
  uint64_t bytes = 0;
};

// Host memory the device can copy from fast (pinned), or pageable when pinning failed.
struct HostStaging {
  std::shared_ptr<std::byte> data;
  uint64_t bytes = 0;
  bool pinned = false;
  std::string why_pageable;  // when !pinned: "pinning failed: ...", "a simulated device"
  bool simulated = false;    // a simulated device's: host memory, there is nothing to pin
};

// When a job's work ran on the device, on the host's steady clock (a GPU converts its event
// times). The kernel span is empty (begin == end) for a plain copy.
struct JobTiming {
  std::chrono::steady_clock::time_point copy_begin, copy_end, kernel_begin, kernel_end;
};

// How a device decodes a quantized weight (Accelerator::DecodesQuantized): what the weight is, and
// where its quant state lies in device memory (on a simulated device: host memory). One per
// weight, shared by its jobs; `owner` keeps that memory until the last of them is gone.
struct QuantDecode {
  Conversion conversion = Conversion::kNone;  // kDequantBlocks, kDequantBnb4, kDequantBnb8 or
                                              // kDequantPackedInt
  PackedLayout layout;     // the weight's (TensorInfo::packed): scheme, states, host tables
  uint64_t int8_cols = 0;  // kDequantBnb8: the weight's columns
  const std::byte* scales = nullptr;  // absmax, SCB or weight_scale / scales (not for GGUF)
  const int16_t* zeros = nullptr;     // PackedIntState::zeros (nullptr when empty)
  const int32_t* g_idx = nullptr;     // PackedIntState::g_idx (nullptr when empty)
  const float* nested_code = nullptr;    // Bnb4State::nested_code (nested only)
  const float* nested_absmax = nullptr;  // Bnb4State::nested_absmax (nested only)
  std::shared_ptr<void> owner;
};

struct PlaceJob {
  const std::byte* src = nullptr;  // host staging, `bytes` long; untouched after `done`
  uint64_t bytes = 0;
  std::byte* dst = nullptr;        // device address inside a DeviceMemory
  // A conversion: src holds `count` elements of `from`, dst receives them as `to`.
  // from == to: a plain copy.
  DType from = DType::kU8;
  DType to = DType::kU8;
  uint64_t count = 0;
  // A float8 weight's block dequant instead of a cast when `fp8.scales` is set (a device
  // address): src holds elements first .. first + count of the row-major weight.
  convert::Fp8BlockScales fp8;
  uint64_t first = 0;
  // A quantized weight's decode instead of a cast when set: src holds the packed bytes of its
  // elements first .. first + count (whole blocks, words or bytes as the plan reads them), dst
  // receives them as `to`.
  std::shared_ptr<const QuantDecode> quant;
  std::function<void(Status)> done;  // called exactly once, from a device thread
  // Set by a traced load only: called once before `done`, from a device thread, when the job
  // ran. Costs the device a few events per job.
  std::function<void(const JobTiming&)> timed;
};

// True when the job runs a kernel (a cast or a dequant), not only a copy.
inline bool Converts(const PlaceJob& job) {
  return job.from != job.to || job.fp8.scales != nullptr || job.quant != nullptr;
}

struct DeviceInfo {
  std::string name;            // "cuda:0", "sim:1"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  std::string description;     // e.g. "NVIDIA H200, 141 GiB, copy + compute streams"
};

class Accelerator {
 public:
  virtual ~Accelerator() = default;

  virtual DeviceInfo Info() const = 0;

  // Errors: OutOfMemory naming the device and the size.
  virtual Result<DeviceMemory> Allocate(uint64_t bytes) = 0;

  // Host memory for staging: pinned when possible; `pinned` says which (the caller logs it).
  virtual Result<HostStaging> AllocateStaging(uint64_t bytes) = 0;

  // True when Submit can run the conversion from → to on the device.
  virtual bool CanConvert(DType from, DType to) const = 0;
  // True when Submit can run a float8 block dequant from → to (PlaceJob::fp8).
  virtual bool CanDequantFp8Block(DType from, DType to) const = 0;
  // True when Submit decodes quantized weights (PlaceJob::quant: every scheme and target the
  // CPU decoders take); else the load's workers decode them and the device copies the result.
  virtual bool DecodesQuantized() const { return false; }

  // Queues the job; returns at once. A job that cannot start (bad arguments) completes with
  // its error through `done` as well, so that every job completes exactly once.
  virtual void Submit(PlaceJob job) = 0;

  // Copies device memory back to the host, synchronously (the check path: CRCs, tests).
  virtual Status CopyToHost(const std::byte* device_src, uint64_t bytes, std::byte* host_dst) = 0;

  // Waits until every submitted job completed. Used on teardown, never on the hot path.
  virtual void Drain() = 0;
};

// The devices a Loader places onto, by name ("cuda:0" → index in the vector).
using DeviceSet = std::vector<std::shared_ptr<Accelerator>>;

}  // namespace loadstone::device

#endif  // LOADSTONE_RUNTIME_DEVICE_ACCELERATOR_H_
