#include "tools/loadstone/convert_feeder.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace loadstone::cli {
namespace {

// Bytes (as written) loaded at once; tensors larger than kPieceBytes are loaded in pieces.
constexpr uint64_t kBatchBytes = 32ULL << 20;
constexpr uint64_t kPieceBytes = 16ULL << 20;

}  // namespace

ConvertFeeder::ConvertFeeder(const Checkpoint& ckpt, std::optional<DType> dtype,
                             const LoaderOptions& loader_options,
                             const InterruptToCancel& interrupt)
    : ckpt_(ckpt),
      dtype_(dtype),
      loader_(loader_options),
      interrupt_(interrupt),
      first_unit_(ckpt.tensors().size(), SIZE_MAX) {}

void ConvertFeeder::AddTensor(size_t tensor, const TensorInfo& src, uint64_t out_bytes,
                              bool decoded, const TensorInfo* scales) {
  if (out_bytes == 0) return;
  first_unit_[tensor] = units_.size();
  if (decoded) return AddDecoded(tensor, src, out_bytes);
  if (scales != nullptr) {  // whole, with its scales, under its own name
    units_.push_back({tensor, 0, out_bytes, src, {*scales}, true});
    return;
  }
  if (src.packed) {  // a quantized tensor copied as stored: its bytes, its state beside it
    TensorInfo bytes = src;
    bytes.packed.reset();
    return AddPlain(tensor, bytes, out_bytes);
  }
  AddPlain(tensor, src, out_bytes);
}

void ConvertFeeder::AddPlain(size_t tensor, const TensorInfo& src, uint64_t out_bytes) {
  const uint64_t numel = src.numel();
  const uint64_t in_elem = DTypeBits(src.dtype) / 8, out_elem = out_bytes / numel;
  if (out_bytes <= kPieceBytes || !src.strides.empty()) {  // strided: whole (the plan bounds it)
    units_.push_back({tensor, 0, out_bytes, src});
    return;
  }
  const uint64_t per = kPieceBytes / std::max(in_elem, out_elem);
  for (uint64_t first = 0; first < numel; first += per) {
    const uint64_t count = std::min(per, numel - first);
    TensorInfo view = src;
    view.shape = {count};
    view.offset = src.offset + first * in_elem;
    view.nbytes = count * in_elem;
    units_.push_back({tensor, first, count * out_elem, std::move(view)});
  }
}

void ConvertFeeder::AddDecoded(size_t tensor, const TensorInfo& src, uint64_t out_bytes) {
  const PackedLayout& packed = *src.packed;
  const auto companions = ckpt_.Companions(src);  // Plan() found them all
  if (companions.ok() && !companions->empty()) {
    Unit unit{tensor, 0, out_bytes, src, {}};
    for (const TensorInfo* c : *companions) unit.with.push_back(*c);
    units_.push_back(std::move(unit));
    return;
  }
  const uint64_t elements = src.element_count();
  const uint64_t out_block = out_bytes / elements * packed.block_elems;
  const uint64_t per = std::max<uint64_t>(1, kPieceBytes / out_block);  // blocks a piece
  const uint64_t blocks = src.nbytes / packed.block_bytes;
  for (uint64_t b = 0; b < blocks; b += per) {
    const uint64_t n = std::min(per, blocks - b);
    TensorInfo view = src;
    view.offset = src.offset + b * packed.block_bytes;
    view.nbytes = n * packed.block_bytes;
    view.shape = {view.nbytes};
    view.packed->element_shape = {n * packed.block_elems};
    units_.push_back({tensor, b * packed.block_elems, n * out_block, std::move(view), {}});
  }
}

void ConvertFeeder::Seal() {
  uint64_t bytes = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (batches_.empty() || bytes + units_[u].out_bytes > kBatchBytes) {
      batches_.emplace_back();
      bytes = 0;
    }
    batches_.back().units.push_back(u);
    if (!units_[u].named) units_[u].view.name = std::to_string(u);
    batch_of_.push_back(batches_.size() - 1);
    bytes += units_[u].out_bytes;
  }
}

Status ConvertFeeder::Fill(size_t tensor, uint64_t offset, std::span<std::byte> chunk) {
  if (interrupt_.interrupted()) return Status::Cancelled("cancelled (Ctrl-C)");
  size_t u = first_unit_.at(tensor);
  uint64_t unit_start = 0;  // byte of the tensor where unit u starts
  while (unit_start + units_[u].out_bytes <= offset) unit_start += units_[u++].out_bytes;
  uint64_t done = 0;
  while (done < chunk.size()) {
    LOADSTONE_ASSIGN_OR_RETURN(const Tensor* t, Loaded(u));
    const uint64_t from = offset + done - unit_start;
    const uint64_t n = std::min<uint64_t>(chunk.size() - done, t->nbytes() - from);
    std::memcpy(chunk.data() + done, t->data() + from, n);
    done += n;
    written_ += n;
    if (done < chunk.size()) unit_start += units_[u++].out_bytes;
  }
  return Status::OK();
}

Status ConvertFeeder::Start(size_t b) {
  Batch& batch = batches_[b];
  if (batch.plan) return Status::OK();
  std::vector<TensorInfo> views;
  for (size_t u : batch.units) {
    views.push_back(units_[u].view);
    views.insert(views.end(), units_[u].with.begin(), units_[u].with.end());
  }
  LOADSTONE_ASSIGN_OR_RETURN(Checkpoint catalog, ckpt_.WithTensors(std::move(views)));
  batch.catalog = std::move(catalog);
  PlanOptions options;
  options.dtype = dtype_;
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(*batch.catalog, options));
  batch.plan = std::move(plan);
  batch.load = loader_.Load(*batch.catalog, *batch.plan);
  return Status::OK();
}

Result<const Tensor*> ConvertFeeder::Loaded(size_t u) {
  const size_t b = batch_of_[u];
  if (b != current_) {
    for (size_t old = 0; old < b; ++old) batches_[old] = Batch{};  // their memory goes now
    LOADSTONE_RETURN_IF_ERROR(Start(b));
    if (Status s = batches_[b].load.Done().get(); !s.ok()) return s;
    if (b + 1 < batches_.size()) LOADSTONE_RETURN_IF_ERROR(Start(b + 1));
    current_ = b;
  }
  const std::string name = units_[u].named ? units_[u].view.name : std::to_string(u);
  return &batches_[b].load.Tensor(name).get();
}

}  // namespace loadstone::cli
