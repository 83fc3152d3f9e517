// RAII owners of CUDA handles: stream, event, device buffer, pinned host buffer. Each is
// move-only and releases its handle in the destructor (errors there are ignored: there is
// nobody to tell). Private to cuda/: this header includes <cuda_runtime.h>.
//
// Every Create/Allocate sets the device it is given for the duration of the call and restores
// the caller's current device, so they may be called from any thread.
#ifndef LOADSTONE_CUDA_CUDA_HANDLES_H_
#define LOADSTONE_CUDA_CUDA_HANDLES_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cuda/cuda_error.h"
#include "loadstone/status.h"

namespace loadstone::cuda {

// Status of a runtime call: CUDA_CALL(cudaMalloc(&p, n), {"cudaMalloc", device, n}).
inline Status Check(cudaError_t err, const CudaCallContext& where) {
  if (err == cudaSuccess) return Status::OK();
  return CudaErrorStatus(static_cast<int>(err), where);
}

// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  Status status_;
};

// A non-blocking stream (no implicit sync with the legacy default stream).
class Stream {
 public:
  Stream() = default;
  static Result<Stream> Create(int device);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  cudaStream_t get() const { return stream_; }

 private:
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

// An event without timing (cheapest to record and wait on), or with timing when asked.
class Event {
 public:
  Event() = default;
  static Result<Event> Create(int device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  cudaEvent_t get() const { return event_; }

 private:
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

// cudaMalloc'd memory. Allocation failure: OutOfMemory naming the device and the size.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(int device, uint64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  void Reset();
  int device_ = -1;
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Page-aligned host memory, registered with cudaHostRegister (portable: pinned for every
// device) so that io_uring can register the same memory as a fixed buffer. When registration
// fails (memlock limits in containers), the memory stays pageable: pinned() is false and
// reason() says why. Allocation of the host memory itself failing is an error.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  static Result<PinnedHostBuffer> Allocate(uint64_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  const std::string& reason() const { return reason_; }

 private:
  void Reset();
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool pinned_ = false;
  std::string reason_;
};

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_CUDA_HANDLES_H_
