// The placement stage of one load: what becomes of a staged read. Its CPU pieces go to the
// workers (Placer::PlaceOnCpu: copies, casts, dequantizations), its device pieces to their device
// (Placer::DeviceJob: a copy, then a cast or decode kernel), each conversion where this load runs
// it (its conversion site: the plan's, or the workers' when the device has no kernel,
// SiteAtStart); a float8 or quantized weight waits for its scales, and a quantized weight's quant
// state goes to its device once, before its pieces (device_quant.h). Its work in flight is
// counted per kind; each piece done advances its tensor and counts one part of the read, whose
// staging slot the read stage frees after the last. Used on the load's event loop, except the
// pieces the workers convert.
#ifndef LOADSTONE_RUNTIME_PIPELINE_PLACEMENT_STAGE_H_
#define LOADSTONE_RUNTIME_PIPELINE_PLACEMENT_STAGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/device/accelerator.h"
#include "runtime/pipeline/device_quant.h"
#include "runtime/pipeline/load_link.h"
#include "runtime/pipeline/placer.h"
#include "runtime/pipeline/read_stage.h"

namespace loadstone::pipeline {

class PlacementStage {
 public:
  // `reads` (the staged bytes, the reads' parts) and `devices` ("cuda:N" = devices[N]) outlive
  // the stage.
  PlacementStage(const StageContext& context, ReadStage& reads, const device::DeviceSet& devices);

  // At the load's start, once its destinations are resolved: each tensor's conversion site for
  // this load (SiteAtStart), the conversions moved off a device counted and named on the backend
  // line.
  void SiteConversions();
  uint64_t conversions_moved() const { return conversions_moved_; }

  // Staged read `id` is whole: its pieces are placed now, or once the scales of a weight in it
  // are in place (the scales' read was issued before it: in flight or being placed).
  void OnStaged(uint64_t id);
  // Tensor `t` is whole, before its future resolves: its quant state on the device is held by
  // its jobs alone from now (freed with the last).
  void Placed(uint32_t t) { device_quant_.Release(t); }
  // Tensor `t` is whole and handed out: the reads waiting for it as a weight's scales go on.
  void Resolved(uint32_t t);

  // Nothing of this stage in flight.
  bool idle() const { return in_flight_.idle(); }

 private:
  // Hands a staged read's pieces to the workers and devices.
  void Dispatch(uint64_t id);
  // Submits tensor `t`'s device piece of staged read `id` (`file_bytes` of its file), counted as
  // one part of the read by the caller; `keep` holds the bytes the job copies from when they are
  // not the staging slot's (a relayout's output).
  void SubmitDevicePiece(uint64_t id, uint32_t t, device::PlaceJob job, uint64_t file_bytes,
                         std::shared_ptr<std::vector<std::byte>> keep);
  // Quantized weight `t`'s device piece of staged read `id`, decoded by its device.
  void SubmitQuantPiece(uint64_t id, uint32_t t, const std::byte* staged);
  // A device piece the CPU prepares first, on a worker, then SubmitDevicePiece (conversion site
  // kCpuThenDevice): a strided or big-endian tensor's relayout, or a quantized weight's decode.
  // Runs on a worker thread; `staged`: the read's staged bytes (ReadStage::StagedBytes).
  void PrepareForDevice(uint64_t id, uint32_t t, const std::byte* staged);
  void ConvertStaged(uint64_t id, const std::byte* staged);  // runs on a worker thread
  // ConvertStaged's pieces of an unshared read, staged at `staged`: each CPU tensor's, converted
  // as planned (Placer::PlaceOnCpu). Runs on a worker thread.
  Status PlaceCpuPieces(uint64_t id, const std::byte* staged);
  void OnStagedDone(uint64_t id, Status status);
  void OnDevicePieceDone(uint64_t id, uint32_t t, uint64_t bytes, Status status);
  // Quantized weight `t`'s quant state on its device, for a device that decodes
  // (ConversionSite::kDevice), its upload counted as work in flight.
  Result<std::shared_ptr<const device::QuantDecode>> DeviceQuant(uint32_t t);
  // The index into `devices` of tensor `t`'s device, -1 for the CPU.
  int DeviceOf(uint32_t t) const;
  // The memory of tensor `t`'s scales (float8 scales, a bitsandbytes absmax) when it is
  // dequantized with them, else null.
  const std::byte* ScalesOf(uint32_t t) const;
  const TensorInfo& SourceOf(uint32_t t) const;  // tensor `t`'s catalog entry

  const StageContext context_;
  ReadStage& reads_;
  const device::DeviceSet& devices_;
  const Placer placer_;
  // Per tensor: where its conversion runs in this load (SiteConversions).
  std::vector<ConversionSite> sites_;
  uint64_t conversions_moved_ = 0;  // ReadStats::conversions_moved
  // Staged reads of weights read before their scales were in place, by scale tensor.
  std::unordered_map<uint32_t, std::vector<uint64_t>> waiting_for_scales_;
  DeviceQuantStates device_quant_;
  // Work under way, by kind; the load finishes only when all of it is done.
  struct WorkInFlight {
    size_t cpu_pieces = 0;     // a staged read's CPU part on a worker (ConvertStaged)
    size_t device_pieces = 0;  // a tensor's piece of a staged read, to OnDevicePieceDone
    size_t quant_uploads = 0;  // quantized weights' quant state copied to their device
    bool idle() const { return cpu_pieces == 0 && device_pieces == 0 && quant_uploads == 0; }
  };
  WorkInFlight in_flight_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_PLACEMENT_STAGE_H_
