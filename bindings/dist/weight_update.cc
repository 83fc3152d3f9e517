// Weight updates in place (include/loadstone/weight_update.h).
#include "loadstone/weight_update.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <new>
#include <span>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bindings/dist/agree.h"
#include "bindings/dist/update_manifest.h"
#include "loadstone/torch.h"

namespace loadstone {
namespace {

using dist::BroadcastManifest;
using dist::BucketBytes;
using dist::Buckets;
using dist::DTypeOfTensor;
using dist::FromJson;
using dist::Item;
using dist::Manifest;
using dist::ManifestOf;
using dist::ToJson;

using Clock = std::chrono::steady_clock;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// An update to `version` of weights at `live`: OK only when it advances them.
Status Advances(uint64_t version, uint64_t live) {
  if (version > live) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "update to version {}, and the weights are at version {}: an update must advance it",
      version, live));
}

// An item of an update that another rank's engine keeps (one of its experts): received, passed
// over here.
constexpr size_t kElsewhere = SIZE_MAX;

// The engine's checks of an update: which live entry each item writes (kElsewhere: none).
Result<std::vector<size_t>> EntriesFor(const Manifest& m, const LiveWeights& weights) {
  LOADSTONE_RETURN_IF_ERROR(Advances(m.version, weights.version()));
  std::vector<size_t> entries;
  for (const Item& item : m.items) {
    const LiveWeights::Entry* e = weights.Find(item.name);
    if (e == nullptr && weights.HeldElsewhere(item.name)) {
      entries.push_back(kElsewhere);
      continue;
    }
    if (e == nullptr) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' of update version {} is not one of this engine's weights", item.name,
          m.version));
    }
    auto dtype = libtorch::FromScalarType(e->tensor.scalar_type());
    if (!dtype.ok() || *dtype != item.dtype || item.shape != e->cut.full_shape) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' of update version {} is {} {}, and the engine's is {} {}: send the "
          "engine's dtype and the full shape",
          item.name, m.version, SafetensorsName(item.dtype), fmt::join(item.shape, "x"),
          dtype.ok() ? SafetensorsName(*dtype) : "?", fmt::join(e->cut.full_shape, "x")));
    }
    entries.push_back(static_cast<size_t>(e - weights.entries().data()));
  }
  return entries;
}

// Every tensor whole on this engine: each bucket is broadcast straight into the staging, where
// its tensors lie one after another already (the trainer sends from its tensors' memory, or
// packs small ones: no copy on either side).
Status ReceiveWhole(ProcessGroups& groups, const Manifest& m,
                    const std::vector<std::pair<size_t, const std::byte*>>& staged,
                    const WeightUpdateOptions& options, WeightUpdateReport& report) {
  for (const auto& bucket : Buckets(m)) {
    const uint64_t n = BucketBytes(m, bucket);
    if (n == 0) continue;
    auto* first = const_cast<std::byte*>(staged[bucket.first].second);
    LOADSTONE_RETURN_IF_ERROR(groups.Broadcast({first, n}, options.trainer_rank));
    report.received_bytes += n;
  }
  return Status::OK();
}

// The parts path's two bucket buffers, each as large as the largest bucket; `staging` passed
// through, or OutOfMemory.
Result<std::byte*> ReserveBuckets(const Manifest& m, std::vector<std::byte> (&buffers)[2],
                                  std::byte* staging) {
  uint64_t largest = 0;
  for (const auto& bucket : Buckets(m)) largest = std::max(largest, BucketBytes(m, bucket));
  try {
    for (auto& buffer : buffers) buffer.resize(largest);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(fmt::format(
        "2 × {} bytes of host memory to receive a weight update's buckets could not be had: free "
        "memory on this engine, or send smaller buckets (WeightUpdateOptions::bucket_bytes, "
        "alone_bytes)",
        largest));
  }
  return staging;
}

// Some tensors are parts here, or another rank's: each bucket lands in one of two buffers, and
// this engine's part of each of its tensors is copied to the staging while the next bucket
// arrives.
Status ReceiveParts(ProcessGroups& groups, const Manifest& m, const LiveWeights& weights,
                    const std::vector<std::pair<size_t, const std::byte*>>& staged,
                    std::vector<std::byte> (&buffers)[2], const WeightUpdateOptions& options,
                    WeightUpdateReport& report) {
  const auto buckets = Buckets(m);
  auto stage = [&](size_t k, size_t b) {
    const std::byte* at = buffers[b].data();
    for (size_t i = buckets[k].first; i < buckets[k].second; ++i) {
      const auto& [index, bytes] = staged[i];
      const uint64_t elem = static_cast<uint64_t>(DTypeBits(m.items[i].dtype)) / 8;
      if (index != kElsewhere) {
        CopyPartOf(weights.entries()[index].cut, weights.tp_rank(), at,
                   const_cast<std::byte*>(bytes), elem);
      }
      at += m.items[i].nbytes;
    }
  };
  std::future<void> staging;
  size_t received = 0;  // broadcasts received: the buffer of the last one is being staged
  for (size_t k = 0; k < buckets.size(); ++k) {
    const uint64_t n = BucketBytes(m, buckets[k]);
    if (n == 0) continue;  // as the trainer: nothing to send, no broadcast
    const size_t b = received++ % 2;
    const std::span<std::byte> buf(buffers[b].data(), n);  // sized before the agreement
    Status status = groups.Broadcast(buf, options.trainer_rank);
    if (staging.valid()) staging.get();
    LOADSTONE_RETURN_IF_ERROR(status);
    report.received_bytes += n;
    try {
      staging = std::async(std::launch::async, stage, k, b);
    } catch (const std::system_error&) {  // no thread to be had: stage it here
      stage(k, b);
    }
  }
  if (staging.valid()) staging.get();
  return Status::OK();
}

}  // namespace

Result<std::byte*> LiveWeights::Staging(uint64_t bytes) {
  if (bytes > staging_bytes_) {
    staging_.reset();
    staging_bytes_ = 0;
    // Not zeroed: every byte is written before it is read.
    std::byte* memory = bytes > PTRDIFF_MAX ? nullptr : new (std::nothrow) std::byte[bytes];
    if (memory == nullptr) {
      return Status::OutOfMemory(fmt::format(
          "{} bytes of host memory to stage a weight update could not be had: free memory on "
          "this engine, or update fewer tensors at a time",
          bytes));
    }
    staging_.reset(memory);
    staging_bytes_ = bytes;
  }
  return staging_.get();
}

void LiveWeights::ReleaseStaging() {
  staging_.reset();
  staging_bytes_ = 0;
}

namespace {

// A cut that gives every rank all of its dimension (ReadMode::kOnce's replicated tensors): whole.
bool WholeOnEveryRank(const TensorShard& cut) {
  if (cut.dim < 0) return true;
  const uint64_t n = cut.full_shape[static_cast<size_t>(cut.dim)];
  return std::all_of(cut.cuts.begin(), cut.cuts.end(), [n](const auto& intervals) {
    return intervals.size() == 1 && intervals[0] == std::pair<uint64_t, uint64_t>{0, n};
  });
}

}  // namespace

Result<std::unique_ptr<LiveWeights>> LiveWeights::Of(Named tensors, const RankShare* share,
                                                     uint64_t version) {
  auto out = std::unique_ptr<LiveWeights>(new LiveWeights());
  out->version_ = version;
  out->tp_rank_ = share != nullptr ? share->tp_rank : 0;
  std::unordered_map<std::string_view, const TensorShard*> cuts;
  if (share != nullptr) {
    for (const TensorShard& s : share->tensors) cuts.emplace(s.name, &s);
    out->elsewhere_.insert(share->elsewhere.begin(), share->elsewhere.end());
  }
  for (auto& [name, t] : tensors) {
    LOADSTONE_RETURN_IF_ERROR(DTypeOfTensor(name, t).status());
    if (out->Find(name) != nullptr) {
      return Status::InvalidArgument(fmt::format("tensor '{}' is given twice", name));
    }
    std::vector<uint64_t> shape;
    for (int64_t d : t.sizes()) shape.push_back(static_cast<uint64_t>(d));
    TensorShard cut{name, "", shape, shape};
    if (auto it = cuts.find(name); it != cuts.end()) cut = *it->second;
    if (WholeOnEveryRank(cut)) cut.dim = -1;  // read once: a replicated tensor "split" whole
    if (cut.shape != shape) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' is {}, and its tensor-parallel part is {}: give the rank's own parts",
          name, fmt::join(shape, "x"), fmt::join(cut.shape, "x")));
    }
    out->index_.emplace(name, out->entries_.size());
    out->entries_.push_back({name, std::move(t), std::move(cut)});
  }
  return out;
}

bool LiveWeights::HeldElsewhere(std::string_view name) const {
  return elsewhere_.count(std::string(name)) > 0;
}

uint64_t LiveWeights::version() const {
  std::shared_lock lock(mutex_);
  return version_;
}

std::shared_lock<std::shared_mutex> LiveWeights::Use() const {
  return std::shared_lock(mutex_);
}

const LiveWeights::Entry* LiveWeights::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Status LiveWeights::Apply(const std::vector<std::pair<size_t, const std::byte*>>& staged,
                          uint64_t version) {
  // The copies in a few threads (one copy does not fill the memory's bandwidth), each a run of
  // entries of about an equal share of the bytes; the engine waits for all of them.
  uint64_t total = 0;
  for (const auto& [index, bytes] : staged) total += entries_[index].tensor.nbytes();
  const unsigned threads =
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4);
  auto copy = [&](size_t first, size_t end) {
    for (size_t i = first; i < end; ++i) {
      at::Tensor& live = entries_[staged[i].first].tensor;
      if (live.nbytes() > 0) std::memcpy(live.data_ptr(), staged[i].second, live.nbytes());
    }
  };
  std::unique_lock lock(mutex_);
  // Checked again under the lock: another update may have come first.
  LOADSTONE_RETURN_IF_ERROR(Advances(version, version_));
  std::vector<std::thread> workers;
  size_t first = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < staged.size(); ++i) {
    bytes += entries_[staged[i].first].tensor.nbytes();
    if (bytes * threads >= total * (workers.size() + 1) && workers.size() + 1 < threads) {
      workers.emplace_back(copy, first, i + 1);
      first = i + 1;
    }
  }
  copy(first, staged.size());
  for (std::thread& t : workers) t.join();
  version_ = version;
  return Status::OK();
}

Result<WeightUpdateReport> SendWeights(ProcessGroups& groups, const Named& tensors,
                                       uint64_t version, const WeightUpdateOptions& options) {
  const int root = options.trainer_rank;
  Result<Manifest> manifest = ManifestOf(tensors, version, options);
  auto sent = BroadcastManifest(groups, root, manifest.ok() ? ToJson(*manifest) : "");
  LOADSTONE_RETURN_IF_ERROR(manifest.status());
  LOADSTONE_RETURN_IF_ERROR(sent.status());
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, Status::OK(), 1, "checking the update"));
  WeightUpdateReport report{version, tensors.size()};
  const auto start = Clock::now();
  // A bucket of one tensor goes straight from its memory; a packed one from a buffer.
  std::vector<std::byte> packed;
  for (const auto& bucket : Buckets(*manifest)) {
    std::span<std::byte> data;
    if (bucket.second - bucket.first == 1) {
      data = {static_cast<std::byte*>(tensors[bucket.first].second.data_ptr()),
              manifest->items[bucket.first].nbytes};
    } else {
      packed.resize(BucketBytes(*manifest, bucket));
      uint64_t at = 0;
      for (size_t i = bucket.first; i < bucket.second; ++i) {
        std::memcpy(packed.data() + at, tensors[i].second.data_ptr(), manifest->items[i].nbytes);
        at += manifest->items[i].nbytes;
      }
      data = packed;
    }
    if (data.empty()) continue;
    Status status = groups.Broadcast(data, root);
    if (!status.ok()) {
      return status.WithContext(fmt::format("sending weight update version {}", version));
    }
    report.sent_bytes += data.size();
  }
  report.transfer_seconds = Since(start);
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, Status::OK(), 1, "receiving the update"));
  return report;
}

Result<WeightUpdateReport> ReceiveWeights(ProcessGroups& groups, LiveWeights& weights,
                                          const WeightUpdateOptions& options) {
  const int root = options.trainer_rank;
  LOADSTONE_ASSIGN_OR_RETURN(const std::string text, BroadcastManifest(groups, root, ""));
  Result<Manifest> manifest = FromJson(text);
  Result<std::vector<size_t>> entries =
      manifest.ok() ? EntriesFor(*manifest, weights)
                    : Result<std::vector<size_t>>(manifest.status());
  // Staging: every tensor's new bytes as this engine holds them, one after another — had before
  // the ranks agree, so that an engine without the memory refuses the update with the others.
  uint64_t staging = 0;
  bool whole = true;  // every tensor whole here: the buckets land in the staging as they are
  for (size_t index : entries.ok() ? *entries : std::vector<size_t>()) {
    whole = whole && index != kElsewhere && weights.entries()[index].cut.dim < 0;
    if (index != kElsewhere) staging += weights.entries()[index].tensor.nbytes();
  }
  Result<std::byte*> memory =
      entries.ok() ? weights.Staging(staging) : Result<std::byte*>(entries.status());
  std::vector<std::byte> buffers[2];  // the parts path's: the largest bucket, twice
  if (memory.ok() && !whole) memory = ReserveBuckets(*manifest, buffers, *memory);
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, memory.status(), 1, "checking the update"));
  WeightUpdateReport report{manifest->version, manifest->items.size()};
  std::vector<std::pair<size_t, const std::byte*>> staged;
  std::byte* at = *memory;
  for (size_t index : *entries) {
    staged.emplace_back(index, at);
    if (index == kElsewhere) continue;
    at += weights.entries()[index].tensor.nbytes();
    report.applied_bytes += weights.entries()[index].tensor.nbytes();
  }
  const auto start = Clock::now();
  Status status = whole ? ReceiveWhole(groups, *manifest, staged, options, report)
                        : ReceiveParts(groups, *manifest, weights, staged, buffers, options,
                                       report);
  if (!status.ok()) {
    return status.WithContext(fmt::format(
        "receiving weight update version {} (the weights stay at version {})",
        manifest->version, weights.version()));
  }
  report.transfer_seconds = Since(start);
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, Status::OK(), 1, "receiving the update"));
  const auto apply = Clock::now();
  std::erase_if(staged, [](const auto& item) { return item.first == kElsewhere; });
  LOADSTONE_RETURN_IF_ERROR(weights.Apply(staged, manifest->version));
  report.apply_seconds = Since(apply);
  return report;
}

Result<WeightUpdateReport> UpdateFromTensors(LiveWeights& weights,
                                             const std::vector<Tensor>& tensors,
                                             uint64_t version) {
  LOADSTONE_RETURN_IF_ERROR(Advances(version, weights.version()));
  std::vector<std::pair<size_t, const std::byte*>> staged;  // the loaded tensors themselves
  WeightUpdateReport report{version, tensors.size()};
  for (const Tensor& t : tensors) {
    const LiveWeights::Entry* e = weights.Find(t.name());
    auto dtype = e != nullptr ? libtorch::FromScalarType(e->tensor.scalar_type())
                              : Result<DType>(DType::kU8);
    if (e == nullptr || t.device() != "cpu" || !dtype.ok() || *dtype != t.dtype() ||
        t.shape() != e->cut.shape || t.nbytes() != static_cast<uint64_t>(e->tensor.nbytes())) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' ({} {} on {}) is not one of the engine's weights as it holds them{}: "
          "nothing of version {} is written",
          t.name(), SafetensorsName(t.dtype()), fmt::join(t.shape(), "x"), t.device(),
          e == nullptr ? "" : fmt::format(" ({})", fmt::join(e->cut.shape, "x")), version));
    }
    staged.emplace_back(static_cast<size_t>(e - weights.entries().data()), t.data());
    report.applied_bytes += t.nbytes();
  }
  const auto apply = Clock::now();
  LOADSTONE_RETURN_IF_ERROR(weights.Apply(staged, version));
  report.apply_seconds = Since(apply);
  return report;
}

}  // namespace loadstone
