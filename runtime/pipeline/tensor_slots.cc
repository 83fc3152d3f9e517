#include "runtime/pipeline/tensor_slots.h"

#include <exception>
#include <utility>

namespace loadstone::pipeline {
namespace {

__extension__ using Wide = unsigned __int128;  // products of two byte counts

}  // namespace

TensorSlots::TensorSlots(const Checkpoint& checkpoint, const LoadPlan& plan, bool indexed)
    : checkpoint_(checkpoint), plan_(plan), slots_(plan.tensors.size()) {
  if (indexed) index_.assign(checkpoint.tensors().size(), ~uint32_t{0});
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    slots_[i].future = slots_[i].promise.get_future().share();
    if (!indexed) continue;
    index_[plan.tensors[i].source] = i;
    slots_[i].remaining = checkpoint.tensors()[plan.tensors[i].source].nbytes;
  }
}

std::optional<uint32_t> TensorSlots::IndexOf(std::string_view name) const {
  const TensorInfo* info = checkpoint_.Find(name);
  if (info == nullptr || index_.empty()) return std::nullopt;
  const uint32_t index = index_[static_cast<size_t>(info - checkpoint_.tensors().data())];
  if (index == ~uint32_t{0}) return std::nullopt;  // not in this load (PlanOptions::include)
  return index;
}

Status TensorSlots::Ensure(uint32_t t, Destinations& destinations) {
  Slot& slot = slots_[t];
  if (slot.data || slot.buffer) return Status::OK();
  LOADSTONE_ASSIGN_OR_RETURN(auto memory, destinations.ForTensor(t));
  slot.buffer = std::move(memory.owner);
  slot.data = memory.data;
  return Status::OK();
}

Status TensorSlots::EnsureShared(const ReadChunk& chunk, Destinations& destinations) {
  if (slots_[chunk.tensors.front()].buffer) return Status::OK();
  LOADSTONE_ASSIGN_OR_RETURN(auto block, destinations.ForSharedRead(chunk));
  for (uint32_t t : chunk.tensors) {
    Slot& slot = slots_[t];
    slot.data = block.data + (checkpoint_.tensors()[plan_.tensors[t].source].offset - chunk.offset);
    slot.buffer = std::shared_ptr<std::byte>(block.owner, slot.data);  // aliasing: keeps the block
  }
  return Status::OK();
}

bool TensorSlots::Place(uint32_t t, uint64_t source_bytes) {
  Slot& slot = slots_[t];
  const TensorPlan& tp = plan_.tensors[t];
  const uint64_t source = checkpoint_.tensors()[tp.source].nbytes;
  // Placed bytes in proportion to the source bytes in place, so that a tensor's pieces add up
  // to exactly its placed size (a cast changes the size; rounding piece by piece would not).
  auto placed = [&](uint64_t remaining) -> uint64_t {
    if (source == 0) return 0;
    return static_cast<uint64_t>(static_cast<Wide>(source - remaining) * tp.nbytes / source);
  };
  const uint64_t before = placed(slot.remaining);
  slot.remaining -= source_bytes;
  bytes_placed_.fetch_add(placed(slot.remaining) - before, std::memory_order_relaxed);
  if (slot.remaining != 0 || slot.done) return false;
  slot.done = true;
  return true;
}

void TensorSlots::Resolve(uint32_t t, Tensor tensor) {
  slots_[t].promise.set_value(std::move(tensor));
  tensors_done_.fetch_add(1, std::memory_order_relaxed);
}

void TensorSlots::FailRest(const Status& error) {
  for (Slot& slot : slots_) {
    if (slot.done) continue;
    slot.promise.set_exception(std::make_exception_ptr(Error(error)));
    slot.buffer.reset();
    slot.data = nullptr;
  }
}

}  // namespace loadstone::pipeline
