// Where each tensor's memory comes from (destinations.h).
#include "runtime/pipeline/destinations.h"

#include "runtime/pipeline/routes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "io/file.h"
#include "io/http_reader.h"
#include "io/posix_error.h"

namespace loadstone::pipeline {

Destinations::Destinations(const Checkpoint& checkpoint, const LoadPlan& plan,
                           const device::DeviceSet& devices, uint64_t host_memory_limit,
                           bool direct_io, CallerMemory caller_memory)
    : checkpoint_(checkpoint),
      plan_(plan),
      devices_(devices),
      direct_io_(direct_io),
      caller_memory_(std::move(caller_memory)),
      budget_(std::make_shared<HostMemoryBudget>(host_memory_limit)),
      small_tensors_(budget_),
      target_device_(plan.targets.size(), -1) {}

Status Destinations::Resolve(const std::string& device_log) {
  for (size_t d = 0; d < plan_.targets.size(); ++d) {
    const Device& target = plan_.targets[d];
    if (target == Device::Cpu()) continue;
    if (target.is_gpu() && target.index >= 0 && target.index < static_cast<int>(devices_.size())) {
      target_device_[d] = target.index;
      if (!staging_device_) staging_device_ = devices_[target.index];
      continue;
    }
    const auto first = std::find_if(plan_.tensors.begin(), plan_.tensors.end(),
                                    [&](const TensorPlan& t) { return t.device == d; });
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is planned on {}, but {}; plan for the devices this machine has "
        "(--device-map cpu, or auto without --max-memory for GPUs)",
        first == plan_.tensors.end() ? std::string("?") : checkpoint_.tensors()[first->source].name,
        target.ToString(),
        devices_.empty() ? fmt::format("the Loader has no GPU ({})", device_log)
                         : fmt::format("this machine has {} GPU(s), cuda:0 to cuda:{}",
                                       devices_.size(), devices_.size() - 1)));
  }
  const auto pinned = std::find_if(plan_.tensors.begin(), plan_.tensors.end(),
                                   [](const TensorPlan& t) { return t.pinned; });
  if (pinned != plan_.tensors.end()) {
    pin_device_ = staging_device_ ? staging_device_ : devices_.empty() ? nullptr : devices_.front();
    if (!pin_device_) {
      return Status::Unsupported(fmt::format(
          "tensor '{}' is planned into pinned host memory (PlanOptions::pin_cpu_tensors), but the "
          "Loader has no GPU to pin it for ({}); load without pinning",
          checkpoint_.tensors()[pinned->source].name, device_log));
    }
  }
  return Status::OK();
}

std::string Destinations::PinnedNote() const {
  if (!pin_device_) return "";
  const device::DeviceInfo info = pin_device_->Info();
  if (info.description.starts_with("simulated")) {  // SimDevice's description
    return fmt::format("CPU tensors asked pinned: {} is simulated, they are ordinary host memory",
                       info.name);
  }
  return fmt::format("CPU tensors in pinned host memory of {}", info.name);
}

std::string Destinations::OpenFreshPages(bool refuse) {
  if (std::none_of(plan_.tensors.begin(), plan_.tensors.end(),
                   [](const TensorPlan& t) { return t.fresh_pages; })) {
    return "";
  }
  auto fresh = refuse ? Result<std::unique_ptr<FreshPages>>(Status::Unsupported(
                            "userfaultfd refused (a test's LoadHooks::refuse_userfaultfd)"))
                      : FreshPages::Open();
  if (fresh.ok()) {
    fresh_ = std::move(*fresh);
    return "CPU tensors written into fresh pages by the workers (userfaultfd)";
  }
  // RouteAtStart gives their reads the routes they have without fresh pages.
  return fmt::format(
      "fresh pages unavailable ({}): CPU tensors are page-faulted and zeroed as they are written",
      fresh.status().message());
}

void Destinations::CloseFreshPages() { fresh_.reset(); }

Status Destinations::MapFiles() {
  for (const CheckpointFile& f : checkpoint_.files()) {
    if (io::IsRemoteAddress(f.path)) {
      return Status::InvalidArgument(fmt::format(
          "--mmap cannot map '{}': it is not a local file; leave --mmap out to read it", f.path));
    }
    // Mapped pages past the file's end would be SIGBUS on first touch: only the file the
    // catalog describes, whole, is mapped.
    LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(f.path));
    LOADSTONE_RETURN_IF_ERROR(io::CheckUnchanged(file, f));
    void* p = f.bytes ? ::mmap(nullptr, f.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd(), 0)
                      : nullptr;
    if (p == MAP_FAILED) return io::ErrnoStatus(errno, "cannot map", f.path);
    mappings_.emplace_back(p, [bytes = f.bytes](void* q) {
      if (q) ::munmap(q, bytes);
    });
    mapped_files_.push_back(std::move(file));
  }
  return Status::OK();
}

Status Destinations::CheckMapped(uint32_t file) const {
  return io::CheckUnchangedNow(mapped_files_.at(file), checkpoint_.files()[file]);
}

void Destinations::CloseMappedFiles() { mapped_files_.clear(); }

Result<Destinations::Memory> Destinations::ForSharedRead(const ReadChunk& read) {
  const uint32_t first = read.tensors.front();
  // In phase with the file, as an in-place tensor (below), so that O_DIRECT lands in it.
  const uint64_t skew = Fresh(first) ? 0 : InPhaseSkew(read.offset);
  auto block = Fresh(first) ? fresh_->Allocate(read.length, budget_)
                            : AllocateHost(read.length + skew, budget_);
  if (!block.ok()) return block.status();
  std::byte* data = block->get() + skew;
  return Memory{*std::move(block), data};
}

Result<Destinations::Memory> Destinations::Pinned(uint64_t bytes, uint64_t skew) {
  // Counted against the load's host budget like any host buffer, and given back with it.
  struct Block {
    std::shared_ptr<std::byte> data;
    std::shared_ptr<HostMemoryBudget> budget;
    uint64_t bytes = 0;
    ~Block() {
      data.reset();  // freed first, then counted as free
      budget->Give(bytes);
    }
  };
  const uint64_t size = std::max<uint64_t>(bytes + skew, 1);
  LOADSTONE_RETURN_IF_ERROR(TakeHostBudget(budget_.get(), size));
  auto block = std::make_shared<Block>();
  block->budget = budget_;
  block->bytes = size;
  auto staging = pin_device_->AllocateStaging(size);
  if (!staging.ok()) return staging.status();
  if (!staging->pinned && !staging->simulated) {
    return Status::OutOfMemory(fmt::format(
        "{} could not pin it ({}); load without PlanOptions::pin_cpu_tensors (--pin-memory), or "
        "free pinned memory",
        pin_device_->Info().name, staging->why_pageable));
  }
  block->data = std::move(staging->data);
  std::byte* data = block->data.get() + skew;
  return Memory{std::shared_ptr<std::byte>(block, data), data};
}

Result<Destinations::Memory> Destinations::FromCaller(const TensorInfo& src,
                                                      const TensorPlan& tp) const {
  if (!caller_memory_) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is planned into the caller's memory (PlanOptions::caller_memory), but the "
        "load was given no LoadOptions::destination",
        src.name));
  }
  std::span<std::byte> given;
  try {
    given = caller_memory_(src, tp);
  } catch (const std::exception& e) {
    return Status::CallbackFailed(fmt::format(
        "LoadOptions::destination threw for tensor '{}': {}", src.name, e.what()));
  } catch (...) {
    return Status::CallbackFailed(
        fmt::format("LoadOptions::destination threw for tensor '{}'", src.name));
  }
  if (given.size() != tp.nbytes || (given.data() == nullptr && tp.nbytes > 0)) {
    return Status::InvalidArgument(fmt::format(
        "LoadOptions::destination gave {} bytes for tensor '{}', which needs {}", given.size(),
        src.name, tp.nbytes));
  }
  // Not owned: the caller keeps it alive until the load is done.
  return Memory{std::shared_ptr<std::byte>(std::shared_ptr<void>(), given.data()), given.data()};
}

Result<Destinations::Memory> Destinations::ForTensor(uint32_t t) {
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  auto failed = [&](const Status& status) {
    return status.WithContext(fmt::format("tensor '{}' ({} bytes) for {}", src.name, tp.nbytes,
                                          plan_.device_of(t).ToString()));
  };
  const StartFacts facts{fresh_ != nullptr, direct_io_};
  // Pinned and host buffers start at the file offset's phase within a page, so that O_DIRECT
  // reads fill them with no bounce copy (unless 64-byte-aligned tensors were asked for).
  const bool in_phase = !plan_.routes.align_tensors && tp.conversion == Conversion::kNone;
  uint64_t skew = 0;
  Result<std::shared_ptr<std::byte>> buffer = std::shared_ptr<std::byte>();
  switch (MemoryAtStart(tp.memory, facts)) {
    case TensorMemory::kDevice: {
      auto memory = devices_[DeviceOf(t)]->Allocate(tp.nbytes);
      if (!memory.ok()) return failed(memory.status());
      return Memory{std::shared_ptr<std::byte>(memory->owner, memory->data), memory->data};
    }
    case TensorMemory::kCaller:
      return FromCaller(src, tp);
    case TensorMemory::kPinned: {
      auto pinned = Pinned(tp.nbytes, in_phase ? InPhaseSkew(src.offset) : 0);
      if (!pinned.ok()) return failed(pinned.status());
      return *std::move(pinned);
    }
    case TensorMemory::kMapped: {
      if (src.file >= mappings_.size()) {
        return failed(Status::Corruption("internal error: a mapped tensor's file is not mapped"));
      }
      auto* data = static_cast<std::byte*>(mappings_[src.file].get()) + src.offset;
      return Memory{std::shared_ptr<std::byte>(mappings_[src.file], nullptr), data};  // keeps the map
    }
    case TensorMemory::kShared:  // the read's buffer (ForSharedRead), made before its tensors'
      return failed(Status::Corruption(
          "internal error: a shared-buffer tensor asked for memory of its own; please report it"));
    case TensorMemory::kFreshPages:  // page-aligned; the workers fill it from staging or the cache
      buffer = fresh_->Allocate(tp.nbytes, budget_);
      break;
    case TensorMemory::kArena:  // shared 64-byte-aligned blocks
      buffer = small_tensors_.Allocate(tp.nbytes);
      break;
    case TensorMemory::kHost:
      skew = in_phase ? InPhaseSkew(src.offset) : 0;
      buffer = AllocateHost(tp.nbytes + skew, budget_);
      break;
  }
  if (!buffer.ok()) return failed(buffer.status());
  std::byte* data = buffer->get() + skew;
  return Memory{*std::move(buffer), data};
}

}  // namespace loadstone::pipeline
