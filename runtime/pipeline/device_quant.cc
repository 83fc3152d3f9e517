#include "runtime/pipeline/device_quant.h"

#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace loadstone::pipeline {
namespace {

// A quantized weight's tables (its scales, a GPTQ weight's zeros and g_idx, a nested bitsandbytes
// weight's code and absmax), each at an 8-byte-aligned offset of one host block that its device
// copies whole; kNone for a table the weight lacks.
struct QuantTables {
  static constexpr uint64_t kNone = UINT64_MAX;
  std::shared_ptr<std::vector<std::byte>> host = std::make_shared<std::vector<std::byte>>();
  uint64_t scales = kNone, zeros = kNone, g_idx = kNone, nested_code = kNone,
           nested_absmax = kNone;

  uint64_t Add(const void* data, uint64_t bytes) {
    const uint64_t at = (host->size() + 7) / 8 * 8;
    host->resize(at + bytes);
    if (bytes) std::memcpy(host->data() + at, data, bytes);
    return at;
  }
  // Points `quant`'s tables into `base`, the block's copy on the device.
  void PointInto(std::byte* base, device::QuantDecode* quant) const {
    auto at = [base](uint64_t offset) { return offset == kNone ? nullptr : base + offset; };
    quant->scales = at(scales);
    quant->zeros = reinterpret_cast<const int16_t*>(at(zeros));
    quant->g_idx = reinterpret_cast<const int32_t*>(at(g_idx));
    quant->nested_code = reinterpret_cast<const float*>(at(nested_code));
    quant->nested_absmax = reinterpret_cast<const float*>(at(nested_absmax));
  }
};

// The tables of weight `src`, whose scales (when its conversion uses them) are `scale_bytes`
// at `scales` in host memory.
QuantTables PackQuantTables(const TensorInfo& src, const TensorPlan& tp, const std::byte* scales,
                            uint64_t scale_bytes) {
  QuantTables tables;
  if (UsesScales(tp.conversion)) tables.scales = tables.Add(scales, scale_bytes);
  if (const auto& s = src.packed->packed_int) {
    if (!s->zeros.empty()) {
      tables.zeros = tables.Add(s->zeros.data(), s->zeros.size() * sizeof(int16_t));
    }
    if (!s->g_idx.empty()) {
      tables.g_idx = tables.Add(s->g_idx.data(), s->g_idx.size() * sizeof(int32_t));
    }
  }
  if (const auto& s = src.packed->bnb4; s && s->nested) {
    tables.nested_code = tables.Add(s->nested_code.data(), sizeof(s->nested_code));
    tables.nested_absmax =
        tables.Add(s->nested_absmax.data(), s->nested_absmax.size() * sizeof(float));
  }
  return tables;
}

}  // namespace

Result<std::shared_ptr<const device::QuantDecode>> DeviceQuantStates::For(
    uint32_t t, const std::byte* scales, device::Accelerator& device,
    const std::function<Uploaded()>& start_upload) {
  if (states_.empty()) states_.resize(plan_.tensors.size());
  if (states_[t]) return states_[t];
  const TensorPlan& tp = plan_.tensors[t];
  const TensorInfo& src = checkpoint_.tensors()[tp.source];
  auto quant = std::make_shared<device::QuantDecode>();
  quant->conversion = tp.conversion;
  quant->layout = *src.packed;
  if (tp.conversion == Conversion::kDequantBnb8) quant->int8_cols = src.shape.at(1);
  const QuantTables tables = PackQuantTables(
      src, tp, scales, UsesScales(tp.conversion) ? plan_.tensors[tp.scale].nbytes : 0);
  const std::shared_ptr<std::vector<std::byte>>& host = tables.host;
  if (!host->empty()) {
    auto memory = device.Allocate(host->size());
    if (!memory.ok()) {
      return memory.status().WithContext(
          fmt::format("the quant state of tensor '{}' ({} bytes)", src.name, host->size()));
    }
    tables.PointInto(memory->data, quant.get());
    quant->owner = memory->owner;
    device::PlaceJob upload;  // before every piece of `t` on this device, whose jobs run in order
    upload.src = host->data();
    upload.bytes = upload.count = host->size();
    upload.dst = memory->data;
    upload.done = [host, uploaded = start_upload()](Status status) {
      uploaded(std::move(status));
    };
    device.Submit(std::move(upload));
  }
  states_[t] = quant;
  return states_[t];
}

}  // namespace loadstone::pipeline
