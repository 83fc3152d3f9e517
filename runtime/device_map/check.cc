// Validation: device_map strings, user-given maps (check_device_map), disk offload.
#include <fmt/format.h>

#include "runtime/device_map/greedy.h"
#include "runtime/device_map/modes.h"
#include "runtime/device_map/module_tree.h"
#include "runtime/device_map/infer.h"

namespace loadstone {
namespace device_map {

Result<ModeChoice> ParseDeviceMapString(std::string_view text) {
  if (text == "auto") return ModeChoice{Mode::kAuto, {}};
  if (text == "balanced") return ModeChoice{Mode::kBalanced, {}};
  if (text == "balanced_low_0") return ModeChoice{Mode::kBalancedLow0, {}};
  if (text == "sequential") return ModeChoice{Mode::kSequential, {}};
  std::string_view digits = text.substr(0, 1) == "-" ? text.substr(1) : text;
  bool integer = !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
  if (integer && text.front() == '-') {
    return Status::InvalidArgument(
        "You can't pass device_map as a negative int. If you want to put the model on the cpu, "
        "pass device_map = 'cpu'");
  }
  if (text != "disk") {
    auto device = ParseDevice(text);
    if (device.ok()) return ModeChoice{Mode::kSingleDevice, *device};
  }
  return Status::InvalidArgument(fmt::format(
      "When passing device_map as a string, the value needs to be a device name (e.g. cpu, "
      "cuda:0) or 'auto', 'balanced', 'balanced_low_0', 'sequential' but found {}.",
      text));
}

std::vector<std::string> UnknownMapKeys(const ModuleTree& tree, const DeviceMap& map) {
  const ModuleTree::Impl& impl = ModuleTreeAccess::Get(tree);
  std::vector<std::string> invalid;
  for (const DeviceMap::Entry& e : map.entries()) {
    if (!e.prefix.empty() && impl.FindNode(e.prefix) < 0) invalid.push_back(e.prefix);
  }
  if (invalid.empty()) return {};
  return {"The following device_map keys do not match any submodules in the model: " +
          PyListRepr(invalid)};
}

}  // namespace device_map

Status CheckDeviceMap(const ModuleTree& tree, const DeviceMap& map,
                      std::vector<std::string>* warnings) {
  if (warnings) {
    for (std::string& w : device_map::UnknownMapKeys(tree, map)) warnings->push_back(std::move(w));
  }
  std::string missing;
  for (const std::string& name : tree.StateDictNames()) {
    if (map.Lookup(name)) continue;
    if (!missing.empty()) missing += ", ";
    missing += name;
  }
  if (!missing.empty()) {
    return Status::InvalidArgument(
        "The device_map provided does not give any device for the following parameters: " + missing);
  }
  return Status::OK();
}

Status CheckDiskOffload(const DeviceMap& map, std::string_view offload_folder,
                        bool source_is_safetensors) {
  bool has_disk = false;
  for (const DeviceMap::Entry& e : map.entries()) has_disk = has_disk || e.device == Device::Disk();
  if (!has_disk || !offload_folder.empty() || source_is_safetensors) return Status::OK();
  return Status::InvalidArgument(
      "The current `device_map` had weights offloaded to the disk. Please provide an "
      "`offload_folder` for them. Alternatively, make sure you have `safetensors` installed if the "
      "model you are using offers the weights in this format.");
}

}  // namespace loadstone
