// Device, ParseDevice and DeviceMap.
#include <algorithm>
#include <charconv>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/json_util.h"
#include "loadstone/device_map.h"
#include "runtime/device_map/json_text.h"

namespace loadstone {
namespace {

std::optional<int> ParseOrdinal(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

}  // namespace

std::string Device::ToString() const {
  switch (type) {
    case Type::kCuda: return fmt::format("cuda:{}", index);
    case Type::kMps: return "mps";
    case Type::kCpu: return "cpu";
    case Type::kDisk: return "disk";
  }
  return "?";
}

std::string Device::ToJsonValue() const {
  return is_gpu() ? std::to_string(index) : device_map::JsonString(ToString());
}

std::string Device::ToKey() const { return is_gpu() ? std::to_string(index) : ToString(); }

Result<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "disk") return Device::Disk();
  if (text == "mps") return Device::Mps();
  if (text == "cuda") return Device::Cuda(0);
  std::string_view number = text;
  if (number.substr(0, 5) == "cuda:") number.remove_prefix(5);
  if (std::optional<int> ordinal = ParseOrdinal(number)) return Device::Cuda(*ordinal);
  return Status::InvalidArgument(fmt::format(
      "'{}' is not a device: use cuda:N, N, cuda, mps, cpu or disk", text));
}

Status DeviceMap::Add(std::string prefix, Device device) {
  if (index_.contains(prefix)) {
    return Status::InvalidArgument(fmt::format("device map key '{}' appears twice", prefix));
  }
  index_.emplace(prefix, entries_.size());
  auto at = std::lower_bound(key_lengths_.begin(), key_lengths_.end(), prefix.size(),
                             std::greater<>());
  if (at == key_lengths_.end() || *at != prefix.size()) key_lengths_.insert(at, prefix.size());
  entries_.push_back(Entry{std::move(prefix), device});
  return Status::OK();
}

const Device* DeviceMap::Find(std::string_view prefix) const {
  auto it = index_.find(prefix);
  return it == index_.end() ? nullptr : &entries_[it->second].device;
}

std::optional<Device> DeviceMap::Lookup(std::string_view tensor_name) const {
  for (size_t length : key_lengths_) {  // longest first
    const bool dotted_prefix = length == tensor_name.size() || length == 0 ||
                               (length < tensor_name.size() && tensor_name[length] == '.');
    if (!dotted_prefix) continue;
    if (const Device* device = Find(tensor_name.substr(0, length))) return *device;
  }
  return std::nullopt;
}

std::string DeviceMap::ToJson() const {
  std::string out = "{";
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i > 0) out += ", ";
    out += device_map::JsonString(entries_[i].prefix);
    out += ": ";
    out += entries_[i].device.ToJsonValue();
  }
  out += "}";
  return out;
}

Result<DeviceMap> DeviceMap::FromJson(std::string_view json) {
  auto parsed = io::ParseJsonStrictOrdered(json, "device map");
  if (!parsed.ok()) return Status::InvalidArgument(std::string(parsed.status().message()));
  if (!parsed->is_object()) return Status::InvalidArgument("a device map must be a JSON object");
  // `loadstone plan --json`'s document: its "device_map" member (no module map has an object
  // as a value).
  auto member = parsed->find("device_map");
  const nlohmann::ordered_json& doc =
      member != parsed->end() && member->is_object() ? *member : *parsed;
  return io::InterpretJson("device map", [&]() -> Result<DeviceMap> {
    DeviceMap map;
    for (const auto& [key, value] : doc.items()) {
      Device device;
      if (value.is_number_unsigned()) {
        if (value.get<uint64_t>() > 1000000000) {
          return Status::InvalidArgument(fmt::format(
              "device map: GPU {} for '{}' is out of range", value.get<uint64_t>(), key));
        }
        device = Device::Cuda(static_cast<int>(value.get<uint64_t>()));
      } else if (value.is_string()) {
        LOADSTONE_ASSIGN_OR_RETURN(device, ParseDevice(value.get<std::string>()));
      } else {
        return Status::InvalidArgument(fmt::format(
            "device map: the value for '{}' must be a GPU ordinal or a device string, not {}",
            key, io::DescribeJsonValue(value)));
      }
      LOADSTONE_RETURN_IF_ERROR(map.Add(key, device));
    }
    return map;
  });
}

}  // namespace loadstone
