#include "cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cast_kernels.h"
#include "cuda/dequant_kernels.h"
#include "cuda/cuda_handles.h"
#include "cuda/place_job.h"
#include "runtime/convert/cast.h"

namespace loadstone::cuda {

using device::Converts;
using device::DeviceInfo;
using device::DeviceMemory;
using device::HostStaging;
using device::PlaceJob;

class CudaDevice::Impl {
 public:
  // A submitted job and its progress. Owned by pending_, then by inflight_.
  struct Job {
    PlaceJob job;
    Impl* impl = nullptr;
    int slot = -1;          // scratch slot while converting
    bool finished = false;  // set by the host function (or at once for errors)
    Status status;
    // A traced job (job.timed): copy begin/end on the copy stream, kernel begin/end on the
    // compute stream.
    std::vector<Event> marks;
  };

  Impl(int ordinal, CudaDeviceOptions options) : ordinal_(ordinal), options_(options) {}

  Status Init() {
    cudaDeviceProp prop{};
    LOADSTONE_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, ordinal_),
                                    {"cudaGetDeviceProperties", ordinal_}));
    gpu_name_ = prop.name;
    total_bytes_ = prop.totalGlobalMem;
    sm_count_ = static_cast<uint32_t>(std::max(prop.multiProcessorCount, 1));
    arch_ = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
    LOADSTONE_ASSIGN_OR_RETURN(copy_, Stream::Create(ordinal_));
    LOADSTONE_ASSIGN_OR_RETURN(compute_, Stream::Create(ordinal_));
    LOADSTONE_ASSIGN_OR_RETURN(copied_, Event::Create(ordinal_));
    // The epoch of traced jobs' event times: an event that completed at a known host time.
    LOADSTONE_ASSIGN_OR_RETURN(epoch_, Event::Create(ordinal_, /*timing=*/true));
    LOADSTONE_RETURN_IF_ERROR(
        Check(cudaEventRecord(epoch_.get(), copy_.get()), {"cudaEventRecord", ordinal_}));
    LOADSTONE_RETURN_IF_ERROR(
        Check(cudaEventSynchronize(epoch_.get()), {"cudaEventSynchronize", ordinal_}));
    epoch_host_ = std::chrono::steady_clock::now();
    const int slots = std::max(options_.scratch_slots, 1);
    slots_.resize(static_cast<size_t>(slots));
    for (int i = slots - 1; i >= 0; --i) free_slots_.push_back(i);
    worker_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  ~Impl() {
    if (worker_.joinable()) {
      Drain();
      {
        std::lock_guard lk(mu_);
        stop_ = true;
      }
      wake_.notify_all();
      worker_.join();
    }
  }

  DeviceInfo Info() const {
    DeviceInfo info;
    info.name = DeviceName(ordinal_);
    info.total_bytes = total_bytes_;
    DeviceGuard guard(ordinal_);
    size_t free = 0, total = 0;
    if (guard.status().ok() && cudaMemGetInfo(&free, &total) == cudaSuccess) {
      info.free_bytes = free;
      info.total_bytes = total;
    }
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f GiB", static_cast<double>(total_bytes_) / (1ull << 30));
    info.description = gpu_name_ + ", " + gib + ", " + arch_ + ", " + std::to_string(sm_count_) +
                       " SMs, copy + compute streams, " + std::to_string(slots_.size()) +
                       " scratch slots";
    const std::string note = StagingNote();
    if (!note.empty()) info.description += "; staging pageable: " + note;
    return info;
  }

  Result<DeviceMemory> Allocate(uint64_t bytes) {
    if (bytes == 0) return DeviceMemory{};
    LOADSTONE_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(ordinal_, bytes));
    auto owner = std::make_shared<DeviceBuffer>(std::move(buf));
    DeviceMemory mem;
    mem.data = owner->data();
    mem.bytes = bytes;
    mem.owner = std::move(owner);
    return mem;
  }

  Result<HostStaging> AllocateStaging(uint64_t bytes) {
    if (bytes == 0) return HostStaging{};
    DeviceGuard guard(ordinal_);  // registration needs a context; portable pins it for all
    LOADSTONE_RETURN_IF_ERROR(guard.status());
    LOADSTONE_ASSIGN_OR_RETURN(PinnedHostBuffer buf, PinnedHostBuffer::Allocate(bytes));
    if (!buf.pinned()) {
      std::lock_guard lk(note_mu_);
      staging_note_ = buf.reason();
    }
    auto holder = std::make_shared<PinnedHostBuffer>(std::move(buf));
    HostStaging staging;
    staging.bytes = bytes;
    staging.pinned = holder->pinned();
    if (!staging.pinned) staging.why_pageable = "pinning failed: " + holder->reason();
    staging.data = std::shared_ptr<std::byte>(holder, holder->data());
    return staging;
  }

  void Submit(PlaceJob job) {
    auto rec = std::make_unique<Job>();
    rec->job = std::move(job);
    rec->impl = this;
    Status invalid = CheckPlaceJob(rec->job, ordinal_);
    if (!invalid.ok() || rec->job.bytes == 0) {
      rec->status = std::move(invalid);
      rec->finished = true;
    }
    {
      std::lock_guard lk(mu_);
      pending_.push_back(std::move(rec));
    }
    wake_.notify_one();
  }

  Status CopyToHost(const std::byte* src, uint64_t bytes, std::byte* dst) {
    if (bytes == 0) return Status::OK();
    if (src == nullptr || dst == nullptr) {
      return Status::InvalidArgument(DeviceName(ordinal_) + ": CopyToHost with a null pointer");
    }
    LOADSTONE_ASSIGN_OR_RETURN(Stream stream, Stream::Create(ordinal_));
    DeviceGuard guard(ordinal_);
    LOADSTONE_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream.get()),
              {"cudaMemcpyAsync (device to host)", ordinal_, bytes}));
    return Check(cudaStreamSynchronize(stream.get()), {"cudaStreamSynchronize", ordinal_, bytes});
  }

  void Drain() {
    std::unique_lock lk(mu_);
    drained_.wait(lk, [this] { return pending_.empty() && inflight_.empty() && delivering_ == 0; });
  }

  std::string StagingNote() const {
    std::lock_guard lk(note_mu_);
    return staging_note_;
  }

  int ordinal_;

 private:
  static void CUDART_CB HostDone(void* p) {  // no CUDA calls allowed in here
    auto* job = static_cast<Job*>(p);
    Impl* impl = job->impl;
    {
      std::lock_guard lk(impl->mu_);
      job->finished = true;
    }
    impl->wake_.notify_one();
  }

  // Enqueues the job's copy (and kernel) and its completion. Runs in the worker thread only.
  Status Dispatch(Job* j) {
    const PlaceJob& job = j->job;
    const int dev = ordinal_;
    std::byte* target = job.dst;
    if (job.timed) {
      for (int k = 0; k < 4; ++k) {
        LOADSTONE_ASSIGN_OR_RETURN(Event e, Event::Create(dev, /*timing=*/true));
        j->marks.push_back(std::move(e));
      }
    }
    auto mark = [&](int k, const Stream& stream) {
      return j->marks.empty() ? Status::OK()
                              : Check(cudaEventRecord(j->marks[k].get(), stream.get()),
                                      {"cudaEventRecord", dev});
    };
    if (Converts(job)) {
      DeviceBuffer& slot = slots_[static_cast<size_t>(j->slot)];
      if (slot.bytes() < job.bytes) {
        slot = DeviceBuffer();  // idle: its last kernel finished before its job was delivered
        LOADSTONE_ASSIGN_OR_RETURN(
            slot, DeviceBuffer::Allocate(dev, std::max(job.bytes, options_.scratch_slot_bytes)));
      }
      target = slot.data();
    }
    LOADSTONE_RETURN_IF_ERROR(mark(0, copy_));
    LOADSTONE_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(target, job.src, job.bytes, cudaMemcpyHostToDevice, copy_.get()),
              {"cudaMemcpyAsync (host to device)", dev, job.bytes}));
    LOADSTONE_RETURN_IF_ERROR(mark(1, copy_));
    LOADSTONE_RETURN_IF_ERROR(
        Check(cudaEventRecord(copied_.get(), copy_.get()), {"cudaEventRecord", dev}));
    LOADSTONE_RETURN_IF_ERROR(Check(cudaStreamWaitEvent(compute_.get(), copied_.get(), 0),
                                    {"cudaStreamWaitEvent", dev}));
    LOADSTONE_RETURN_IF_ERROR(mark(2, compute_));
    if (job.quant != nullptr) {
      LOADSTONE_RETURN_IF_ERROR(LaunchQuantJob(job, target, compute_.get(), sm_count_, dev));
    } else if (job.fp8.scales != nullptr) {
      LOADSTONE_RETURN_IF_ERROR(LaunchDequantFp8Block(job.from, job.to, target, job.dst, job.first,
                                                      job.count, job.fp8, compute_.get(),
                                                      sm_count_, dev));
    } else if (Converts(job)) {
      LOADSTONE_RETURN_IF_ERROR(
          LaunchCast(job.from, job.to, target, job.dst, job.count, compute_.get(), sm_count_, dev));
    }
    LOADSTONE_RETURN_IF_ERROR(mark(3, compute_));
    return Check(cudaLaunchHostFunc(compute_.get(), &Impl::HostDone, j),
                 {"cudaLaunchHostFunc", dev});
  }

  // A finished traced job's event times on the host clock (the events have completed).
  device::JobTiming Timing(const Job& j) const {
    device::JobTiming t;
    std::chrono::steady_clock::time_point* at[] = {&t.copy_begin, &t.copy_end, &t.kernel_begin,
                                                    &t.kernel_end};
    for (size_t k = 0; k < 4; ++k) {
      float ms = 0;
      cudaEventElapsedTime(&ms, epoch_.get(), j.marks[k].get());
      *at[k] = epoch_host_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double, std::milli>(ms));
    }
    if (!Converts(j.job)) t.kernel_end = t.kernel_begin;  // a plain copy ran no kernel
    return t;
  }

  // A failed dispatch may have left a copy or kernel running that reads the staging memory or
  // the slot: wait for both streams before the job completes (error path only).
  void SettleAfterError() {
    cudaStreamSynchronize(copy_.get());
    cudaStreamSynchronize(compute_.get());
  }

  // After a sticky error (illegal address, ...) host functions never run: fail what is left.
  void FailInflightIfBroken(std::unique_lock<std::mutex>& lk) {
    lk.unlock();
    const cudaError_t err = cudaStreamQuery(compute_.get());
    lk.lock();
    if (err == cudaSuccess || err == cudaErrorNotReady) return;
    const Status broken = CudaErrorStatus(static_cast<int>(err), {"a queued copy or kernel", ordinal_});
    for (auto& j : inflight_) {
      if (!j->finished) {
        j->status = broken;
        j->finished = true;
      }
    }
  }

  void Run() {
    cudaSetDevice(ordinal_);
    std::unique_lock lk(mu_);
    for (;;) {
      bool progressed = false;
      while (!inflight_.empty() && inflight_.front()->finished) {  // deliver, in order
        std::unique_ptr<Job> j = std::move(inflight_.front());
        inflight_.pop_front();
        if (j->slot >= 0) free_slots_.push_back(j->slot);
        ++delivering_;
        lk.unlock();
        auto done = std::move(j->job.done);
        Status status = std::move(j->status);
        if (status.ok() && j->job.timed && j->marks.size() == 4) j->job.timed(Timing(*j));
        j.reset();
        if (done) done(std::move(status));
        lk.lock();
        --delivering_;
        progressed = true;
      }
      while (!pending_.empty()) {  // dispatch, in order; a conversion waits for a slot
        Job* j = pending_.front().get();
        const bool needs_slot = !j->finished && Converts(j->job);
        if (needs_slot && free_slots_.empty()) break;
        if (needs_slot) {
          j->slot = free_slots_.back();
          free_slots_.pop_back();
        }
        inflight_.push_back(std::move(pending_.front()));
        pending_.pop_front();
        progressed = true;
        if (j->finished) continue;
        lk.unlock();
        Status status = Dispatch(j);
        if (!status.ok()) SettleAfterError();
        lk.lock();
        if (!status.ok()) {
          j->status = std::move(status);
          j->finished = true;
        }
      }
      if (progressed) {
        drained_.notify_all();
        continue;
      }
      if (stop_ && pending_.empty() && inflight_.empty()) break;
      if (inflight_.empty()) {
        wake_.wait(lk);
      } else if (wake_.wait_for(lk, std::chrono::milliseconds(200)) == std::cv_status::timeout) {
        FailInflightIfBroken(lk);
      }
    }
  }

  CudaDeviceOptions options_;
  std::string gpu_name_, arch_;
  uint64_t total_bytes_ = 0;
  uint32_t sm_count_ = 1;
  Stream copy_, compute_;
  Event copied_;                     // recorded per job on copy_, waited on by compute_
  Event epoch_;                      // traced jobs' times are measured from it
  std::chrono::steady_clock::time_point epoch_host_;  // when epoch_ completed
  std::vector<DeviceBuffer> slots_;  // touched by the worker thread only

  std::mutex mu_;
  std::condition_variable wake_;     // the worker: new jobs, finished jobs, stop
  std::condition_variable drained_;  // Drain(): progress was made
  std::deque<std::unique_ptr<Job>> pending_;
  std::deque<std::unique_ptr<Job>> inflight_;
  std::vector<int> free_slots_;
  int delivering_ = 0;
  bool stop_ = false;
  std::thread worker_;

  mutable std::mutex note_mu_;
  std::string staging_note_;
};

// ---- CudaDevice ----------------------------------------------------------------------------

Result<std::shared_ptr<CudaDevice>> CudaDevice::Open(int ordinal, CudaDeviceOptions options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaErrorStatus(static_cast<int>(err), {"cudaGetDeviceCount", ordinal});
  }
  if (ordinal < 0 || ordinal >= count) {
    return Status::NotFound(DeviceName(ordinal) + ": no such GPU (" + std::to_string(count) +
                            " visible); fix: check CUDA_VISIBLE_DEVICES and nvidia-smi");
  }
  auto impl = std::make_unique<Impl>(ordinal, options);
  LOADSTONE_RETURN_IF_ERROR(impl->Init());
  return std::shared_ptr<CudaDevice>(new CudaDevice(std::move(impl)));
}

CudaDevice::CudaDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaDevice::~CudaDevice() = default;

DeviceInfo CudaDevice::Info() const { return impl_->Info(); }
Result<DeviceMemory> CudaDevice::Allocate(uint64_t bytes) { return impl_->Allocate(bytes); }
Result<HostStaging> CudaDevice::AllocateStaging(uint64_t bytes) {
  return impl_->AllocateStaging(bytes);
}
bool CudaDevice::CanConvert(DType from, DType to) const {
  return from == to || CanCastOnDevice(from, to);
}
bool CudaDevice::CanDequantFp8Block(DType from, DType to) const {
  return CanDequantFp8BlockOnDevice(from, to);
}
void CudaDevice::Submit(PlaceJob job) { impl_->Submit(std::move(job)); }
Status CudaDevice::CopyToHost(const std::byte* src, uint64_t bytes, std::byte* dst) {
  return impl_->CopyToHost(src, bytes, dst);
}
void CudaDevice::Drain() { impl_->Drain(); }
int CudaDevice::ordinal() const { return impl_->ordinal_; }
std::string CudaDevice::StagingNote() const { return impl_->StagingNote(); }

}  // namespace loadstone::cuda
