// Weight updates in place (include/loadstone/weight_update.h).
#include "loadstone/weight_update.h"

#include <chrono>
#include <cstring>
#include <future>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bindings/dist/agree.h"
#include "loadstone/torch.h"

namespace loadstone {
namespace {

using Clock = std::chrono::steady_clock;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

// A manifest larger than this is not one (a peer that speaks something else).
constexpr uint64_t kMaxManifestBytes = 64ULL << 20;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Item {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
};

struct Manifest {
  uint64_t version = 0;
  std::vector<Item> items;
};

// Consecutive items of at most `bucket_bytes` together (a larger item alone): [first, end).
std::vector<std::pair<size_t, size_t>> Buckets(const Manifest& m, uint64_t bucket_bytes) {
  std::vector<std::pair<size_t, size_t>> out;
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.items.size(); ++i) {
    if (out.empty() || bytes + m.items[i].nbytes > bucket_bytes) {
      out.emplace_back(i, i);
      bytes = 0;
    }
    out.back().second = i + 1;
    bytes += m.items[i].nbytes;
  }
  return out;
}

uint64_t BucketBytes(const Manifest& m, std::pair<size_t, size_t> bucket) {
  uint64_t n = 0;
  for (size_t i = bucket.first; i < bucket.second; ++i) n += m.items[i].nbytes;
  return n;
}

Result<DType> DTypeOfTensor(const std::string& name, const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' of a weight update is not a contiguous tensor on the CPU: give .contiguous() "
        "host tensors",
        name));
  }
  auto dtype = libtorch::FromScalarType(t.scalar_type());
  if (!dtype.ok()) return dtype.status().WithContext(name);
  return *dtype;
}

Result<Manifest> ManifestOf(const Named& tensors, uint64_t version) {
  Manifest m{version, {}};
  std::unordered_map<std::string_view, int> seen;
  for (const auto& [name, t] : tensors) {
    if (!seen.emplace(name, 0).second) {
      return Status::InvalidArgument(fmt::format("tensor '{}' is in the update twice", name));
    }
    LOADSTONE_ASSIGN_OR_RETURN(const DType dtype, DTypeOfTensor(name, t));
    Item item{name, dtype, {}, static_cast<uint64_t>(t.nbytes())};
    for (int64_t d : t.sizes()) item.shape.push_back(static_cast<uint64_t>(d));
    m.items.push_back(std::move(item));
  }
  return m;
}

std::string ToJson(const Manifest& m) {
  nlohmann::json doc;
  doc["version"] = m.version;
  auto& items = doc["tensors"] = nlohmann::json::array();
  for (const Item& i : m.items) {
    items.push_back({i.name, SafetensorsName(i.dtype), i.shape});
  }
  return doc.dump();
}

Result<Manifest> FromJson(const std::string& text) {
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  auto bad = [] { return Status::InvalidArgument("the weight update's manifest is malformed"); };
  if (!doc.is_object() || !doc.contains("version") || !doc["version"].is_number_unsigned() ||
      !doc.contains("tensors") || !doc["tensors"].is_array()) {
    return bad();
  }
  Manifest m{doc["version"].get<uint64_t>(), {}};
  for (const auto& entry : doc["tensors"]) {
    if (!entry.is_array() || entry.size() != 3 || !entry[0].is_string() ||
        !entry[1].is_string() || !entry[2].is_array()) {
      return bad();
    }
    const auto dtype = DTypeFromSafetensorsName(entry[1].get<std::string>());
    if (!dtype || DTypeBits(*dtype) % 8 != 0) return bad();
    const uint64_t elem = static_cast<uint64_t>(DTypeBits(*dtype)) / 8;
    Item item{entry[0].get<std::string>(), *dtype, {}, elem};
    for (const auto& d : entry[2]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ULL << 40)) return bad();
      item.shape.push_back(d.get<uint64_t>());
      if (item.shape.back() != 0 && item.nbytes > (1ULL << 50) / item.shape.back()) return bad();
      item.nbytes *= item.shape.back();
    }
    m.items.push_back(std::move(item));
  }
  return m;
}

// The engine's checks of an update: which live entry each item writes, and its staging.
Result<std::vector<std::pair<size_t, at::Tensor>>> StagingFor(const Manifest& m,
                                                              const LiveWeights& weights) {
  if (m.version <= weights.version()) {
    return Status::InvalidArgument(fmt::format(
        "update to version {}, and the weights are at version {}: an update must advance it",
        m.version, weights.version()));
  }
  std::vector<std::pair<size_t, at::Tensor>> staged;
  for (const Item& item : m.items) {
    const LiveWeights::Entry* e = weights.Find(item.name);
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
    staged.emplace_back(static_cast<size_t>(e - weights.entries().data()),
                        at::empty_like(e->tensor));
  }
  return staged;
}

// The manifest from the trainer: its size, then its text (size 0: the trainer refused).
Result<std::string> BroadcastManifest(ProcessGroups& groups, int root, std::string text) {
  uint64_t size = text.size();
  LOADSTONE_RETURN_IF_ERROR(
      groups.Broadcast({reinterpret_cast<std::byte*>(&size), sizeof size}, root));
  if (size == 0 || size > kMaxManifestBytes) {
    return Status::IOError(fmt::format(
        "rank {} sent no weight update (a manifest of {} bytes): its own error says why", root,
        size));
  }
  text.resize(size);
  LOADSTONE_RETURN_IF_ERROR(groups.Broadcast({reinterpret_cast<std::byte*>(text.data()), size},
                                             root));
  return text;
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
    if (cut.shape != shape) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' is {}, and its tensor-parallel part is {}: give the rank's own parts",
          name, fmt::join(shape, "x"), fmt::join(cut.shape, "x")));
    }
    out->entries_.push_back({name, std::move(t), std::move(cut)});
  }
  return out;
}

uint64_t LiveWeights::version() const {
  std::shared_lock lock(mutex_);
  return version_;
}

std::shared_lock<std::shared_mutex> LiveWeights::Use() const {
  return std::shared_lock(mutex_);
}

const LiveWeights::Entry* LiveWeights::Find(std::string_view name) const {
  for (const Entry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void LiveWeights::Apply(const std::vector<std::pair<size_t, const std::byte*>>& staged,
                        uint64_t version) {
  std::unique_lock lock(mutex_);
  for (const auto& [index, bytes] : staged) {
    at::Tensor& live = entries_[index].tensor;
    if (live.nbytes() > 0) std::memcpy(live.data_ptr(), bytes, live.nbytes());
  }
  version_ = version;
}

Result<WeightUpdateReport> SendWeights(ProcessGroups& groups, const Named& tensors,
                                       uint64_t version, const WeightUpdateOptions& options) {
  const int root = options.trainer_rank;
  Result<Manifest> manifest = ManifestOf(tensors, version);
  auto sent = BroadcastManifest(groups, root, manifest.ok() ? ToJson(*manifest) : "");
  LOADSTONE_RETURN_IF_ERROR(manifest.status());
  LOADSTONE_RETURN_IF_ERROR(sent.status());
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, Status::OK(), 1, "checking the update"));
  WeightUpdateReport report{version, tensors.size()};
  const auto start = Clock::now();
  const auto buckets = Buckets(*manifest, options.bucket_bytes);
  // Two buckets in memory: the next one is packed while this one is broadcast.
  std::vector<std::byte> buffers[2];
  auto pack = [&](size_t k) {
    std::vector<std::byte>& buf = buffers[k % 2];
    buf.resize(BucketBytes(*manifest, buckets[k]));
    uint64_t at = 0;
    for (size_t i = buckets[k].first; i < buckets[k].second; ++i) {
      std::memcpy(buf.data() + at, tensors[i].second.data_ptr(), manifest->items[i].nbytes);
      at += manifest->items[i].nbytes;
    }
  };
  std::future<void> packed = std::async(std::launch::async, pack, 0);
  for (size_t k = 0; k < buckets.size(); ++k) {
    packed.get();
    if (k + 1 < buckets.size()) packed = std::async(std::launch::async, pack, k + 1);
    Status status = groups.Broadcast(buffers[k % 2], root);
    if (!status.ok()) {
      if (packed.valid()) packed.wait();
      return status.WithContext(fmt::format("sending weight update version {}", version));
    }
    report.sent_bytes += buffers[k % 2].size();
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
  Result<std::vector<std::pair<size_t, at::Tensor>>> staged =
      manifest.ok() ? StagingFor(*manifest, weights)
                    : Result<std::vector<std::pair<size_t, at::Tensor>>>(manifest.status());
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, staged.status(), 1, "checking the update"));
  WeightUpdateReport report{manifest->version, manifest->items.size()};
  const auto start = Clock::now();
  const auto buckets = Buckets(*manifest, options.bucket_bytes);
  std::vector<std::byte> buffers[2];
  // This rank's part of each tensor of bucket k into its staging, while bucket k+1 arrives.
  auto stage = [&](size_t k) {
    const std::byte* at = buffers[k % 2].data();
    for (size_t i = buckets[k].first; i < buckets[k].second; ++i) {
      const auto& [index, bytes] = (*staged)[i];
      const LiveWeights::Entry& e = weights.entries()[index];
      CopyPartOf(e.cut, weights.tp_rank(), at, static_cast<std::byte*>(bytes.data_ptr()),
                 static_cast<uint64_t>(DTypeBits(manifest->items[i].dtype)) / 8);
      at += manifest->items[i].nbytes;
    }
  };
  std::future<void> staging;
  for (size_t k = 0; k < buckets.size(); ++k) {
    std::vector<std::byte>& buf = buffers[k % 2];
    buf.resize(BucketBytes(*manifest, buckets[k]));
    Status status = groups.Broadcast(buf, root);
    if (staging.valid()) staging.get();
    if (!status.ok()) {
      return status.WithContext(fmt::format("receiving weight update version {} (the weights "
                                            "stay at version {})",
                                            manifest->version, weights.version()));
    }
    report.received_bytes += buf.size();
    staging = std::async(std::launch::async, stage, k);
  }
  if (staging.valid()) staging.get();
  report.transfer_seconds = Since(start);
  LOADSTONE_RETURN_IF_ERROR(dist::Agree(groups, Status::OK(), 1, "receiving the update"));
  const auto apply = Clock::now();
  std::vector<std::pair<size_t, const std::byte*>> bytes;
  for (const auto& [index, t] : *staged) {
    bytes.emplace_back(index, static_cast<const std::byte*>(t.data_ptr()));
    report.applied_bytes += t.nbytes();
  }
  weights.Apply(bytes, manifest->version);
  report.apply_seconds = Since(apply);
  return report;
}

Result<WeightUpdateReport> UpdateFromTensors(LiveWeights& weights,
                                             const std::vector<Tensor>& tensors,
                                             uint64_t version) {
  if (version <= weights.version()) {
    return Status::InvalidArgument(fmt::format(
        "update to version {}, and the weights are at version {}: an update must advance it",
        version, weights.version()));
  }
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
  weights.Apply(staged, version);
  report.apply_seconds = Since(apply);
  return report;
}

}  // namespace loadstone
