// Where each tensor's memory comes from: its device, a mapping of its file (mmap mode), fresh
// pages the workers fill (runtime/pipeline/fresh_pages.h), or an ordinary host buffer placed
// for O_DIRECT. Members of LoadHandle::State (load_state.h), run on the loop thread.
#include "runtime/pipeline/load_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "io/posix_error.h"

namespace loadstone {

void LoadHandle::State::OpenFreshPages() {
  if (std::none_of(plan.tensors.begin(), plan.tensors.end(),
                   [](const TensorPlan& t) { return t.fresh_pages; })) {
    return;
  }
  auto fresh = pipeline::FreshPages::Open();
  std::lock_guard lock(callbacks_mu);
  if (fresh.ok()) {
    fresh_ = std::move(*fresh);
    backend_description += "; CPU tensors written into fresh pages by the workers (userfaultfd)";
  } else {  // RouteAtStart gives their reads the routes they have without fresh pages
    backend_description += fmt::format(
        "; fresh pages unavailable ({}): CPU tensors are page-faulted and zeroed as they are "
        "written", fresh.status().message());
  }
}

Status LoadHandle::State::CheckFileSize(uint32_t file, uint64_t needed) const {
  const CheckpointFile& f = checkpoint.files()[file];
  struct stat st;
  if (::stat(f.path.c_str(), &st) != 0) return io::ErrnoStatus(errno, "cannot stat", f.path);
  const auto now = static_cast<uint64_t>(st.st_size);
  if (now == f.bytes || (needed != 0 && now >= needed)) return Status::OK();
  // The first tensor the file no longer holds, for the message.
  const TensorInfo* lost = nullptr;
  for (const TensorInfo& t : checkpoint.tensors()) {
    if (t.file == file && t.offset + t.nbytes > now && (!lost || t.offset < lost->offset)) lost = &t;
  }
  return Status::Corruption(fmt::format(
      "'{}' is {} bytes, {} when the checkpoint was opened: it changed{}; open the checkpoint "
      "again (and do not rewrite a file while it loads)",
      f.path, now, f.bytes,
      lost ? fmt::format(", and tensor '{}' (bytes {}..{}) is past its end", lost->name,
                         lost->offset, lost->offset + lost->nbytes)
           : std::string()));
}

Status LoadHandle::State::MapFiles() {
  for (const CheckpointFile& f : checkpoint.files()) {
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io::ErrnoStatus(errno, "cannot open", f.path);
    void* p = f.bytes ? ::mmap(nullptr, f.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : nullptr;
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return io::ErrnoStatus(err, "cannot map", f.path);
    mappings_.emplace_back(p, [bytes = f.bytes](void* q) {
      if (q) ::munmap(q, bytes);
    });
  }
  return Status::OK();
}

Status LoadHandle::State::EnsureSharedBuffer(uint64_t id) {
  const ReadChunk& chunk = plan.reads[id];
  const uint32_t first = chunk.tensors.front();
  if (tensors[first].buffer) return Status::OK();
  // In phase with the file, as an in-place tensor (below), so that O_DIRECT lands in it.
  const uint64_t skew =
      Fresh(first) || !loader_options.direct_io ? 0 : chunk.offset % pipeline::kHostAlignment;
  auto block = Fresh(first) ? fresh_->Allocate(chunk.length, budget_)
                            : pipeline::AllocateHost(chunk.length + skew, budget_);
  if (!block.ok()) return ChunkError(id, block.status());
  for (uint32_t t : chunk.tensors) {
    TensorSlot& slot = tensors[t];
    slot.data = block->get() + skew + (checkpoint.tensors()[plan.tensors[t].source].offset - chunk.offset);
    slot.buffer = std::shared_ptr<std::byte>(*block, slot.data);  // aliasing: keeps the block
  }
  return Status::OK();
}

Status LoadHandle::State::EnsureDestination(uint32_t index) {
  TensorSlot& slot = tensors[index];
  if (slot.data || slot.buffer) return Status::OK();
  const TensorPlan& tp = plan.tensors[index];
  const TensorInfo& src = checkpoint.tensors()[tp.source];
  if (const int device = DeviceOf(index); device >= 0) {
    auto memory = devices[device]->Allocate(tp.nbytes);
    if (!memory.ok()) {
      return memory.status().WithContext(fmt::format("tensor '{}' ({} bytes) for {}", src.name,
                                                     tp.nbytes, plan.device_of(index).ToString()));
    }
    slot.buffer = std::shared_ptr<std::byte>(memory->owner, memory->data);  // aliasing
    slot.data = memory->data;
    return Status::OK();
  }
  if (plan.routes.mmap && tp.conversion == Conversion::kNone && !mappings_.empty()) {
    slot.buffer = std::shared_ptr<std::byte>(mappings_[src.file], nullptr);  // aliasing: keeps the map
    slot.data = static_cast<std::byte*>(mappings_[src.file].get()) + src.offset;
    return Status::OK();
  }
  if (Fresh(index)) {  // page-aligned; the workers fill it from staging or the cache
    auto buffer = fresh_->Allocate(tp.nbytes, budget_);
    if (!buffer.ok()) {
      return buffer.status().WithContext(
          fmt::format("tensor '{}' ({} bytes)", src.name, tp.nbytes));
    }
    slot.buffer = std::move(*buffer);
    slot.data = slot.buffer.get();
    return Status::OK();
  }
  // Small tensors that only ever arrive through staging share blocks (64-byte aligned).
  if (tp.nbytes < pipeline::SmallTensorArena::kLargest && staged_only_[index]) {
    auto buffer = small_tensors_.Allocate(tp.nbytes);
    if (!buffer.ok()) {
      return buffer.status().WithContext(fmt::format("tensor '{}' ({} bytes)", src.name, tp.nbytes));
    }
    slot.buffer = std::move(*buffer);
    slot.data = slot.buffer.get();
    return Status::OK();
  }
  // In place: the first byte sits at the file offset's phase within a page, so that O_DIRECT
  // reads fill the buffer with no bounce copy (unless 64-byte-aligned tensors were asked for).
  const bool in_phase = loader_options.direct_io && !plan.routes.align_tensors &&
                        tp.conversion == Conversion::kNone;
  const uint64_t skew = in_phase ? src.offset % pipeline::kHostAlignment : 0;
  auto buffer = pipeline::AllocateHost(tp.nbytes + skew, budget_);
  if (!buffer.ok()) {
    return buffer.status().WithContext(
        fmt::format("tensor '{}' ({} bytes) from '{}'", src.name, tp.nbytes,
                    checkpoint.files()[src.file].path));
  }
  slot.buffer = std::move(*buffer);
  slot.data = slot.buffer.get() + skew;
  return Status::OK();
}

}  // namespace loadstone
