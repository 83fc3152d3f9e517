// The placement stage (placement_stage.h): staged reads' pieces handed to the workers
// (Placer::PlaceOnCpu) and the devices (Placer::DeviceJob), weights held back until their scales
// are in place, each piece's completion counted back on the event loop.
#include "runtime/pipeline/placement_stage.h"

#include <asio/post.hpp>

#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/pipeline/destinations.h"
#include "runtime/pipeline/routes.h"
#include "runtime/pipeline/tensor_slots.h"
#include "runtime/pipeline/trace.h"

namespace loadstone::pipeline {

PlacementStage::PlacementStage(const StageContext& context, ReadStage& reads,
                               const device::DeviceSet& devices)
    : context_(context),
      reads_(reads),
      devices_(devices),
      placer_(context.checkpoint, context.plan, context.destinations),
      device_quant_(context.checkpoint, context.plan) {}

int PlacementStage::DeviceOf(uint32_t t) const { return context_.destinations.DeviceOf(t); }

const std::byte* PlacementStage::ScalesOf(uint32_t t) const {
  const TensorPlan& tp = context_.plan.tensors[t];
  return UsesScales(tp.conversion) ? context_.tensors.data(tp.scale) : nullptr;
}

const TensorInfo& PlacementStage::SourceOf(uint32_t t) const {
  return context_.checkpoint.tensors()[context_.plan.tensors[t].source];
}

void PlacementStage::SiteConversions() {
  const LoadPlan& plan = context_.plan;
  sites_.resize(plan.tensors.size());
  std::vector<uint64_t> moved(devices_.size());
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorPlan& tp = plan.tensors[t];
    const int device = DeviceOf(t);
    const bool decodes = device >= 0 && devices_[device]->DecodesQuantized();
    sites_[t] = SiteAtStart(tp.conversion_site, tp.conversion, decodes);
    if (device >= 0 && sites_[t] != tp.conversion_site) ++moved[device];
  }
  for (size_t d = 0; d < moved.size(); ++d) {
    if (moved[d] == 0) continue;
    conversions_moved_ += moved[d];
    context_.load.Note(fmt::format(
        "cuda:{} has no kernels for quantized weights: {} planned for it decoded by the workers",
        d, moved[d]));
  }
}

void PlacementStage::OnStaged(uint64_t id) {
  for (uint32_t t : context_.plan.reads[id].tensors) {
    const TensorPlan& tp = context_.plan.tensors[t];
    if (UsesScales(tp.conversion) && !context_.tensors.done(tp.scale)) {
      waiting_for_scales_[tp.scale].push_back(id);
      return;
    }
  }
  Dispatch(id);
}

void PlacementStage::Resolved(uint32_t t) {
  if (auto waiting = waiting_for_scales_.extract(t)) {
    for (uint64_t id : waiting.mapped()) Dispatch(id);
  }
}

void PlacementStage::Dispatch(uint64_t id) {
  const ReadChunk& chunk = context_.plan.reads[id];
  const std::byte* staged = reads_.StagedBytes(id);
  bool cpu_pieces = false;
  for (uint32_t t : chunk.tensors) {
    if (DeviceOf(t) < 0) {
      cpu_pieces = true;
      continue;
    }
    reads_.AddPart(id);
    ++in_flight_.device_pieces;
    if (sites_[t] == ConversionSite::kCpuThenDevice) {
      asio::post(context_.workers, [this, hold = context_.load.Hold(), id, t, staged] {
        PrepareForDevice(id, t, staged);
      });
    } else if (Unpacks(context_.plan.tensors[t].conversion)) {
      SubmitQuantPiece(id, t, staged);
    } else {
      const auto [lo, hi] = PieceOf(chunk, SourceOf(t));
      SubmitDevicePiece(id, t,
                        placer_.DeviceJob(chunk, t, context_.tensors.data(t), ScalesOf(t), staged),
                        hi - lo, nullptr);
    }
  }
  if (cpu_pieces) {
    reads_.AddPart(id);
    ++in_flight_.cpu_pieces;
    asio::post(context_.workers, [this, hold = context_.load.Hold(), id, staged] {
      ConvertStaged(id, staged);
    });
  }
}

void PlacementStage::SubmitQuantPiece(uint64_t id, uint32_t t, const std::byte* staged) {
  const ReadChunk& chunk = context_.plan.reads[id];
  const auto [lo, hi] = PieceOf(chunk, SourceOf(t));
  auto quant = DeviceQuant(t);
  auto job = quant.ok() ? placer_.QuantJob(chunk, t, context_.tensors.data(t), staged, *quant)
                        : Result<device::PlaceJob>(quant.status());
  if (!job.ok()) {  // an event of its own: the read's other tensors still read its slot
    context_.load.OnLoop([this, id, t, bytes = hi - lo, status = job.status()]() mutable {
      OnDevicePieceDone(id, t, bytes, std::move(status));
    });
    return;
  }
  SubmitDevicePiece(id, t, std::move(*job), hi - lo, nullptr);
}

Result<std::shared_ptr<const device::QuantDecode>> PlacementStage::DeviceQuant(uint32_t t) {
  auto start_upload = [this, t] {
    ++in_flight_.quant_uploads;
    return [this, hold = context_.load.Hold(), t](Status status) {
      context_.load.OnLoop([this, t, status = std::move(status)] {
        --in_flight_.quant_uploads;
        if (status.ok()) return;
        context_.load.Fail(status.WithContext(
            fmt::format("copying the quant state of tensor '{}' to {}", SourceOf(t).name,
                        context_.plan.device_of(t).ToString())));
      });
    };
  };
  return device_quant_.For(t, ScalesOf(t), *devices_[DeviceOf(t)], start_upload);
}

void PlacementStage::PrepareForDevice(uint64_t id, uint32_t t, const std::byte* staged) {
  const ReadChunk& chunk = context_.plan.reads[id];
  const auto [lo, hi] = PieceOf(chunk, SourceOf(t));
  const bool decode = Unpacks(context_.plan.tensors[t].conversion);
  auto plain = std::make_shared<std::vector<std::byte>>();
  const std::byte* from = staged + (lo - chunk.offset);
  Status status = decode ? placer_.Dequantize(t, ScalesOf(t), from, lo, hi, plain.get())
                         : placer_.Relayout(t, from, lo, hi, plain.get());
  context_.load.OnLoop([this, id, t, lo = lo, hi = hi, decode, plain = std::move(plain),
                        status = std::move(status)]() mutable {
    if (!status.ok() || context_.load.stopping()) {
      OnDevicePieceDone(id, t, hi - lo, std::move(status));
      return;
    }
    std::byte* data = context_.tensors.data(t);
    device::PlaceJob job =
        decode ? placer_.DequantizedJob(t, data, *plain, lo)
               : placer_.DeviceJobFrom(t, data, ScalesOf(t), plain->data(), lo, lo + plain->size());
    SubmitDevicePiece(id, t, std::move(job), hi - lo, std::move(plain));
  });
}

void PlacementStage::SubmitDevicePiece(uint64_t id, uint32_t t, device::PlaceJob job,
                                       uint64_t file_bytes,
                                       std::shared_ptr<std::vector<std::byte>> keep) {
  if (context_.trace.enabled()) {  // the device's own copy and kernel times, one track per stream
    job.timed = [this, hold = context_.load.Hold(), t,
                 bytes = job.bytes](const device::JobTiming& at) {
      const TensorPlan& p = context_.plan.tensors[t];
      const std::string track = context_.plan.device_of(t).ToString();
      const std::string args =
          fmt::format(R"({{"tensor":{}}})", nlohmann::json(SourceOf(t).name).dump());
      context_.trace.SpanOnTrack(fmt::format("h2d {} B", bytes), "device", track + " copy",
                                 at.copy_begin, at.copy_end, args);
      if (at.kernel_end > at.kernel_begin) {
        context_.trace.SpanOnTrack(
            fmt::format("{} {}", ConversionName(p.conversion), TorchName(p.dtype)), "device",
            track + " compute", at.kernel_begin, at.kernel_end, args);
      }
    };
  }
  job.done = [this, hold = context_.load.Hold(), id, t, bytes = file_bytes,
              keep = std::move(keep)](Status s) {
    context_.load.OnLoop([this, id, t, bytes, keep, s = std::move(s)]() mutable {
      OnDevicePieceDone(id, t, bytes, std::move(s));
    });
  };
  context_.load.CancelIfAskedAt(LoadStage::kDeviceCopy);
  devices_[DeviceOf(t)]->Submit(std::move(job));
}

void PlacementStage::OnDevicePieceDone(uint64_t id, uint32_t t, uint64_t bytes, Status status) {
  --in_flight_.device_pieces;
  if (!status.ok()) {
    context_.load.Fail(status.WithContext(fmt::format(
        "placing tensor '{}' on {}", SourceOf(t).name, context_.plan.device_of(t).ToString())));
  } else if (!context_.load.stopping()) {
    context_.load.Advance(t, bytes);
  }
  reads_.PartDone(id);
}

Status PlacementStage::PlaceCpuPieces(uint64_t id, const std::byte* staged) {
  const ReadChunk& chunk = context_.plan.reads[id];
  for (uint32_t t : chunk.tensors) {
    if (DeviceOf(t) >= 0) continue;  // a device piece: its device does it
    const auto [lo, hi] = PieceOf(chunk, SourceOf(t));
    Status status = placer_.PlaceOnCpu(t, context_.tensors.data(t), ScalesOf(t),
                                       staged + (lo - chunk.offset), lo, hi);
    if (!status.ok()) {
      return status.WithContext(fmt::format("placing tensor '{}'", SourceOf(t).name));
    }
  }
  return Status::OK();
}

void PlacementStage::ConvertStaged(uint64_t id, const std::byte* staged) {
  TraceRecorder& trace = context_.trace;
  const auto begin = trace.Now();
  const ReadChunk& chunk = context_.plan.reads[id];
  // What the workers do with it, for the trace and the test hook: a conversion, or a copy.
  Conversion did = Conversion::kNone;
  for (uint32_t t : chunk.tensors) {
    const Conversion c = context_.plan.tensors[t].conversion;
    if (DeviceOf(t) < 0 && c != Conversion::kNone) did = c;
  }
  if (did != Conversion::kNone) context_.load.CancelIfAskedAt(LoadStage::kConverting);
  Status status;
  if (chunk.shared_buffer) {  // one copy of the whole read into its tensors' shared buffer
    status = placer_.PlaceShared(chunk, reads_.ReadDestination(id), staged);
    if (!status.ok()) status = reads_.chunks().Error(id, status);
  } else {
    status = PlaceCpuPieces(id, staged);
  }
  if (trace.enabled()) {  // named by what the workers did
    const bool copy = did == Conversion::kNone;
    trace.Span(fmt::format("{} {}", copy ? "copy" : ConversionName(did), reads_.chunks().Label(id)),
               copy ? "copy" : "convert", begin, reads_.chunks().Args(id));
  }
  context_.load.OnLoop([this, id, status = std::move(status)]() mutable {
    OnStagedDone(id, std::move(status));
  });
}

void PlacementStage::OnStagedDone(uint64_t id, Status status) {
  --in_flight_.cpu_pieces;
  if (!status.ok()) {
    context_.load.Fail(std::move(status));
  } else if (!context_.load.stopping()) {
    context_.load.AdvanceChunk(id);
  }
  reads_.PartDone(id);
}

}  // namespace loadstone::pipeline
