#include "cuda/cuda_handles.h"

#include <cstdlib>
#include <utility>

namespace loadstone::cuda {

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != device) {
    status_ = Check(cudaSetDevice(device), {"cudaSetDevice", device});
    changed_ = status_.ok();
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_ && previous_ >= 0) cudaSetDevice(previous_);
}

// ---- Stream --------------------------------------------------------------------------------

Result<Stream> Stream::Create(int device) {
  DeviceGuard guard(device);
  LOADSTONE_RETURN_IF_ERROR(guard.status());
  Stream s;
  LOADSTONE_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking),
                                  {"cudaStreamCreateWithFlags", device}));
  s.device_ = device;
  return s;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    device_ = other.device_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

// ---- Event ---------------------------------------------------------------------------------

Result<Event> Event::Create(int device, bool timing) {
  DeviceGuard guard(device);
  LOADSTONE_RETURN_IF_ERROR(guard.status());
  Event e;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  LOADSTONE_RETURN_IF_ERROR(
      Check(cudaEventCreateWithFlags(&e.event_, flags), {"cudaEventCreateWithFlags", device}));
  e.device_ = device;
  return e;
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

// ---- DeviceBuffer --------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::Allocate(int device, uint64_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  DeviceGuard guard(device);
  LOADSTONE_RETURN_IF_ERROR(guard.status());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    return Check(err, {"cudaMalloc", device, bytes});
  }
  b.device_ = device;
  b.data_ = static_cast<std::byte*>(p);
  b.bytes_ = bytes;
  return b;
}

void DeviceBuffer::Reset() {
  if (data_ != nullptr) {
    DeviceGuard guard(device_);
    cudaFree(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// ---- PinnedHostBuffer ----------------------------------------------------------------------

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(uint64_t bytes) {
  PinnedHostBuffer b;
  if (bytes == 0) return b;
  constexpr uint64_t kPage = 4096;  // O_DIRECT and io_uring fixed buffers want page alignment
  const uint64_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) {
    return Status::OutOfMemory("host staging: cannot allocate " + FormatBytes(rounded) +
                               " of host memory; fix: lower the staging pool size");
  }
  b.data_ = static_cast<std::byte*>(p);
  b.bytes_ = bytes;
  const cudaError_t err = cudaHostRegister(p, rounded, cudaHostRegisterPortable);
  if (err == cudaSuccess) {
    b.pinned_ = true;
  } else {
    cudaGetLastError();
    b.reason_ = "cudaHostRegister of " + FormatBytes(rounded) + " failed: " +
                cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                "); staging stays pageable, host-to-device copies will be slower; fix: raise "
                "the locked-memory limit (ulimit -l, or --ulimit memlock=-1 for containers)";
  }
  return b;
}

void PinnedHostBuffer::Reset() {
  if (data_ != nullptr) {
    if (pinned_) cudaHostUnregister(data_);
    std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

PinnedHostBuffer::~PinnedHostBuffer() { Reset(); }

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      reason_(std::move(other.reason_)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    reason_ = std::move(other.reason_);
  }
  return *this;
}

}  // namespace loadstone::cuda
