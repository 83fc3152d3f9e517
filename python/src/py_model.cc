// Device maps from a model description (what loadstone.torch.describe makes of a live module):
// accelerate's infer_auto_device_map, for the drop-ins and `python -m loadstone`.
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "errors.h"
#include "loadstone/device_map.h"
#include "loadstone/diagnostics.h"
#include "loadstone/platform.h"
#include "loadstone/version.h"
#include "options.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

nb::dict InferFromDescription(const std::string& model_json, nb::kwargs kwargs) {
  Result<ModelDescription> parsed = ParseModelDescription(model_json);
  if (!parsed.ok()) throw StatusError(parsed.status().WithContext("model description"));
  ModelDescription description = std::move(parsed).value();
  // The description's planning fields are the defaults; the keyword arguments win.
  DeviceMapOptions options = description.options;
  nb::dict rest = nb::borrow<nb::dict>(kwargs);
  TakeDeviceMapOptions(rest, options);
  if (rest.size() != 0) {
    std::string keys;
    for (auto [k, _] : rest) keys += (keys.empty() ? "" : ", ") + nb::cast<std::string>(nb::str(k));
    throw nb::type_error(("infer_device_map: unknown option(s) " + keys).c_str());
  }
  Result<DevicePlan> planned = [&] {
    nb::gil_scoped_release unlocked;
    return InferDeviceMap(description.tree, options);
  }();
  const DevicePlan& plan = ValueOrThrow(std::move(planned));
  nb::dict out;
  out["device_map"] = DeviceMapToPython(plan.device_map);
  out["usage"] = UsageToPython(plan);
  nb::list buffers;
  for (const BufferPlacement& b : plan.buffers) {
    buffers.append(nb::make_tuple(b.name, b.device ? DeviceToPython(*b.device) : nb::none()));
  }
  out["buffers"] = buffers;
  out["no_split"] = plan.no_split;
  out["default_no_split"] = plan.default_no_split;
  out["warnings"] = plan.warnings;
  out["explanation"] = plan.explanation;
  return out;
}

}  // namespace

void RegisterModel(nb::module_& m) {
  m.def("infer_device_map", &InferFromDescription, nb::arg("model_json"), nb::arg("kwargs"),
        "accelerate's get_balanced_memory + infer_auto_device_map over a model description "
        "(docs/model-json.md); options as plan()'s device-map options.");
  m.def("check_model_json", [](const std::string& model_json) {
    Result<ModelDescription> d = ParseModelDescription(model_json);
    if (!d.ok()) throw StatusError(d.status().WithContext("model description"));
    return d->tree.num_tensors();
  }, "Parses a model description; returns how many tensors it names. Errors as the CLI's.");
  m.def("parse_size", [](const std::string& text) { return ValueOrThrow(ParseSizeString(text)); },
        "accelerate's convert_file_size_to_int for a string.");
  m.def("platform", [](nb::handle spec) {
    auto platform = ParsePlatform(spec);
    nb::dict out;
    out["description"] = platform->description();
    out["simulated"] = platform->simulated();
    nb::list gpus;
    for (const PlatformGpu& g : platform->Gpus()) {
      nb::dict d;
      d["name"] = g.name;
      d["description"] = g.description;
      d["memory_bytes"] = g.memory_bytes;
      d["free_bytes"] = g.free_bytes;
      gpus.append(d);
    }
    out["gpus"] = gpus;
    Result<uint64_t> host = platform->AvailableHostBytes();
    out["host_available_bytes"] = host.ok() ? nb::object(nb::int_(*host)) : nb::none();
    return out;
  }, nb::arg("spec") = nb::none());
  m.def("cached_fraction", [](nb::handle path) {
    const std::string p = nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(path));
    nb::gil_scoped_release unlocked;
    return ValueOrThrow(CachedFraction(p));
  }, nb::arg("path"), "The share of the file's pages in the page cache now (nothing is read).");
  m.attr("MOSTLY_CACHED") = kMostlyCached;
  m.attr("__version__") = LOADSTONE_VERSION_STRING;
}

}  // namespace loadstone::python
