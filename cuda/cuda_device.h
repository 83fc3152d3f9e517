// CudaDevice: the Device interface (runtime/device/accelerator.h) on one CUDA GPU.
//
// Per device: a copy stream and a compute stream (both non-blocking), a small pool of device
// scratch slots for conversions, and one completion thread. A job is dispatched in submission
// order by that thread:
//   plain (from == to):  cudaMemcpyAsync host -> dst on the copy stream;
//   conversion:          cudaMemcpyAsync host -> scratch slot on the copy stream, an event,
//                        the compute stream waits on it, the cast kernel writes dst;
// then (for both) the compute stream waits on the copy and a host function
// (cudaLaunchHostFunc) marks the job finished. The completion thread calls `done` in
// submission order — never a blocking synchronisation on the hot path. A conversion waits in
// the queue (not in the caller's thread) while every scratch slot is in use.
//
// Thread safety: every method may be called from any thread; `done` callbacks may Submit.
// REQUIRES: Drain() is not called from inside a `done` callback (it would wait on itself).
// Compiled, not yet run on a GPU.
#ifndef LOADSTONE_CUDA_CUDA_DEVICE_H_
#define LOADSTONE_CUDA_CUDA_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loadstone/status.h"
#include "runtime/device/accelerator.h"

namespace loadstone::cuda {

struct CudaDeviceOptions {
  // Conversions in flight at once (each holds one slot until its kernel finished).
  int scratch_slots = 4;
  // A slot's size on first use; a bigger job grows its slot (cudaFree + cudaMalloc, in the
  // completion thread, while the slot is idle).
  uint64_t scratch_slot_bytes = 64ull << 20;
};

class CudaDevice final : public device::Accelerator {
 public:
  // Opens GPU `ordinal`: creates its streams and the completion thread. Errors: NotFound for
  // an ordinal that is not there, Unsupported without a driver, as CudaErrorStatus says.
  static Result<std::shared_ptr<CudaDevice>> Open(int ordinal, CudaDeviceOptions options = {});

  ~CudaDevice() override;  // Drains: every job submitted completes (its done runs) first
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  device::DeviceInfo Info() const override;
  Result<device::DeviceMemory> Allocate(uint64_t bytes) override;
  // Pinned (cudaHostRegister, portable) page-aligned memory; pageable when pinning fails —
  // then StagingNote() says why (also appended to Info().description).
  Result<device::HostStaging> AllocateStaging(uint64_t bytes) override;
  bool CanConvert(DType from, DType to) const override;
  bool CanDequantFp8Block(DType from, DType to) const override;
  // Yes: the kernels of dequant_kernels.h (compiled, not yet run on a GPU).
  bool DecodesQuantized() const override { return true; }
  void Submit(device::PlaceJob job) override;
  Status CopyToHost(const std::byte* device_src, uint64_t bytes, std::byte* host_dst) override;
  void Drain() override;

  int ordinal() const;
  // Empty while every staging allocation was pinned; else the reason of the last fallback.
  std::string StagingNote() const;

  class Impl;

 private:
  explicit CudaDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Free and total bytes per visible GPU (cudaMemGetInfo), index = ordinal; empty without a
// driver or a GPU. What the default Platform reports (cuda/cuda_platform.cc).
struct CudaMemory {
  uint64_t free = 0;
  uint64_t total = 0;
};
std::vector<CudaMemory> CudaMemoryPerDevice();
// The free bytes of CudaMemoryPerDevice().
std::vector<uint64_t> CudaFreeBytesPerDevice();

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_CUDA_DEVICE_H_
