// The manifest of a weight update (update_manifest.h).
#include "bindings/dist/update_manifest.h"

#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/torch.h"

namespace loadstone::dist {
namespace {

// A manifest larger than this is not one (a peer that speaks something else).
constexpr uint64_t kMaxManifestBytes = 64ULL << 20;

}  // namespace

std::vector<std::pair<size_t, size_t>> Buckets(const Manifest& m) {
  std::vector<std::pair<size_t, size_t>> out;
  uint64_t bytes = 0;
  bool open = false;  // the last bucket takes more small tensors
  for (size_t i = 0; i < m.items.size(); ++i) {
    const bool alone = m.items[i].nbytes >= m.alone_bytes;
    if (alone || !open || bytes + m.items[i].nbytes > m.bucket_bytes) {
      out.emplace_back(i, i);
      bytes = 0;
    }
    open = !alone;
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

Result<Manifest> ManifestOf(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            uint64_t version, const WeightUpdateOptions& options) {
  if (options.bucket_bytes == 0) return Status::InvalidArgument("a bucket of 0 bytes");
  Manifest m{version, options.bucket_bytes, options.alone_bytes, {}};
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
  doc["bucket_bytes"] = m.bucket_bytes;
  doc["alone_bytes"] = m.alone_bytes;
  auto& items = doc["tensors"] = nlohmann::json::array();
  for (const Item& i : m.items) {
    items.push_back({i.name, SafetensorsName(i.dtype), i.shape});
  }
  return doc.dump();
}

Result<Manifest> FromJson(const std::string& text) {
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  auto bad = [] { return Status::InvalidArgument("the weight update's manifest is malformed"); };
  for (const char* key : {"version", "bucket_bytes", "alone_bytes"}) {
    if (!doc.is_object() || !doc.contains(key) || !doc[key].is_number_unsigned()) return bad();
  }
  if (!doc.contains("tensors") || !doc["tensors"].is_array() ||
      doc["bucket_bytes"].get<uint64_t>() == 0) {
    return bad();
  }
  Manifest m{doc["version"].get<uint64_t>(), doc["bucket_bytes"].get<uint64_t>(),
             doc["alone_bytes"].get<uint64_t>(), {}};
  std::unordered_set<std::string> names;  // a name twice would be staged twice
  for (const auto& entry : doc["tensors"]) {
    if (!entry.is_array() || entry.size() != 3 || !entry[0].is_string() ||
        !entry[1].is_string() || !entry[2].is_array()) {
      return bad();
    }
    const auto dtype = DTypeFromSafetensorsName(entry[1].get<std::string>());
    if (!dtype || DTypeBits(*dtype) % 8 != 0) return bad();
    const uint64_t elem = static_cast<uint64_t>(DTypeBits(*dtype)) / 8;
    Item item{entry[0].get<std::string>(), *dtype, {}, elem};
    if (entry[2].size() > 16 || !names.insert(item.name).second) return bad();
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

Result<std::string> BroadcastManifest(ProcessGroups& groups, int root, std::string text) {
  uint64_t size = text.size();
  LOADSTONE_RETURN_IF_ERROR(
      groups.Broadcast({reinterpret_cast<std::byte*>(&size), sizeof size}, root));
  if (groups.options().rank == root && size > kMaxManifestBytes) {  // the sender's own words
    return Status::InvalidArgument(fmt::format(
        "the weight update's manifest is {} bytes, over the {} bytes one may hold (the engines "
        "refuse it): send the tensors in several updates",
        size, kMaxManifestBytes));
  }
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

}  // namespace loadstone::dist
