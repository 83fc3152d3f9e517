// Quantized weights' quant states on their devices, for the devices that decode
// (ConversionSite::kDevice): per weight, its scales (in host memory by the time its first piece
// is dispatched) and the catalog's tables (zero points, g_idx, nested bitsandbytes tables)
// packed into one host block, copied into one device allocation by one job submitted before any
// of the weight's pieces (a device runs its jobs in order), and held until the weight is whole.
// Used on the load's event loop only.
#ifndef LOADSTONE_RUNTIME_PIPELINE_DEVICE_QUANT_H_
#define LOADSTONE_RUNTIME_PIPELINE_DEVICE_QUANT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "runtime/device/accelerator.h"

namespace loadstone::pipeline {

class DeviceQuantStates {
 public:
  // Both outlive this (they are the load's).
  DeviceQuantStates(const Checkpoint& checkpoint, const LoadPlan& plan)
      : checkpoint_(checkpoint), plan_(plan) {}

  // What a quant state's upload job calls when it completes.
  using Uploaded = std::function<void(Status)>;

  // Weight `t`'s quant state on `device`, made the first time it is asked: its tables copied
  // there by one job. `start_upload` is called just before that job is submitted (not at all
  // when there is nothing to copy, or allocating fails) and returns what its completion calls.
  // `scales`: its scale tensor's memory when its conversion uses one (UsesScales), else null.
  // Errors: the device's allocation, with the tensor named.
  Result<std::shared_ptr<const device::QuantDecode>> For(
      uint32_t t, const std::byte* scales, device::Accelerator& device,
      const std::function<Uploaded()>& start_upload);
  // Weight `t` is whole: its state is held by its jobs alone from now, freed with the last.
  void Release(uint32_t t) {
    if (t < states_.size()) states_[t].reset();
  }

 private:
  const Checkpoint& checkpoint_;
  const LoadPlan& plan_;
  std::vector<std::shared_ptr<const device::QuantDecode>> states_;  // per tensor, once made
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_DEVICE_QUANT_H_
