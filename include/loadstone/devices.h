// Devices and device maps: where tensors go ("cuda:0", "cpu", "disk"), the ordered map from
// module prefixes to devices that accelerate calls `hf_device_map`, and the memory budgets
// (max_memory) planning reads. Pure values.
#ifndef LOADSTONE_DEVICES_H_
#define LOADSTONE_DEVICES_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "loadstone/status.h"

namespace loadstone {

// A place for tensors. Devices order as accelerate orders them: GPUs by ordinal, mps, cpu, disk.
struct Device {
  enum class Type : uint8_t { kCuda, kMps, kCpu, kDisk };
  Type type = Type::kCpu;
  int index = 0;  // the GPU ordinal for kCuda; 0 otherwise

  static Device Cuda(int index) { return Device{Type::kCuda, index}; }
  static Device Mps() { return Device{Type::kMps, 0}; }
  static Device Cpu() { return Device{Type::kCpu, 0}; }
  static Device Disk() { return Device{Type::kDisk, 0}; }

  bool is_gpu() const { return type == Type::kCuda; }
  // "cuda:0", "mps", "cpu", "disk".
  std::string ToString() const;
  // accelerate's spelling as a JSON value and as a max_memory key: 0, "mps", "cpu", "disk"
  // (ToJsonValue) and "0", "mps", "cpu", "disk" (ToKey).
  std::string ToJsonValue() const;
  std::string ToKey() const;

  friend bool operator==(const Device&, const Device&) = default;
  friend auto operator<=>(const Device&, const Device&) = default;
};

// Parses "cuda:N", "cuda" (= cuda:0), "N" (= cuda:N), "mps", "cpu" and "disk".
// Errors: InvalidArgument (anything else, a negative or huge ordinal).
Result<Device> ParseDevice(std::string_view text);

// An ordered map from module (or tensor) name prefixes to devices, as accelerate's
// `hf_device_map`. The key "" covers the whole model.
class DeviceMap {
 public:
  struct Entry {
    std::string prefix;
    Device device;
    friend bool operator==(const Entry&, const Entry&) = default;
  };

  DeviceMap() = default;

  // Appends an entry. Errors: InvalidArgument when `prefix` is already a key.
  Status Add(std::string prefix, Device device);

  const std::vector<Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // The device stored under exactly `prefix`, or nullptr.
  const Device* Find(std::string_view prefix) const;

  // The device of a tensor: the entry with the longest dotted prefix of `tensor_name` (the name
  // itself, then "a.b" for "a.b.c", ..., then ""). nullopt when no entry covers the name.
  // Probes only the prefixes as long as some key, so a deep name costs little.
  std::optional<Device> Lookup(std::string_view tensor_name) const;

  // `{"model.embed_tokens": 0, "lm_head": "cpu"}`: entry order, GPUs as integers, the spacing of
  // Python's json.dumps (so the text equals json.dumps(model.hf_device_map)).
  std::string ToJson() const;

  // Parses a JSON object of the ToJson form; values may also be device strings ("cuda:1").
  // A document with a "device_map" object member (what `loadstone plan --json` prints) gives
  // that member. Keeps the key order. Errors: InvalidArgument (not an object, a bad device, a
  // key twice, a number beyond double's range, nesting deeper than 256).
  static Result<DeviceMap> FromJson(std::string_view json);

  friend bool operator==(const DeviceMap& a, const DeviceMap& b) { return a.entries_ == b.entries_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index_;
  std::vector<size_t> key_lengths_;  // the keys' distinct lengths, longest first
};

// accelerate's convert_file_size_to_int for a string: "10GiB" = 10·2^30, "10GB" = 10^10, "5MB" =
// 5·10^6, "5Mb" = 625,000 (a lowercase final b means bits, decimal units only). The number is
// parsed as Python's float() parses it, multiplied, truncated.
// Errors: InvalidArgument with accelerate's message ("`size` X is not in a valid format. ...")
// for no or an unknown unit ("100", "5TB", "5B"), a bad number, a negative result.
Result<uint64_t> ParseSizeString(std::string_view text);

// One max_memory value as accelerate accepts it: an integer (bytes, used as is), a float (bytes,
// used as is) or a size string (ParseSizeString).
using SizeValue = std::variant<int64_t, double, std::string>;

// Budget per device. Keys: "0", "1", ... or "cuda:0", ... for GPUs, "mps", "cpu", "disk".
using MaxMemory = std::map<std::string, SizeValue>;

}  // namespace loadstone

#endif  // LOADSTONE_DEVICES_H_
