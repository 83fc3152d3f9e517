#include "options.h"

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <nanobind/stl/string.h>

#include "errors.h"
#include "loadstone/model.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

std::string Str(nb::handle value) { return nb::cast<std::string>(nb::str(value)); }

[[noreturn]] void Invalid(const std::string& message) {
  throw StatusError(Status::InvalidArgument(message));
}

std::vector<std::string> StringList(nb::handle value, const char* option) {
  if (nb::isinstance<nb::str>(value)) return {Str(value)};
  std::vector<std::string> out;
  try {
    for (nb::handle item : nb::iter(value)) out.push_back(Str(item));
  } catch (const nb::python_error&) {
    Invalid(std::string(option) + ": expected a string or a list of strings");
  }
  return out;
}

std::unordered_set<std::string> NameSet(nb::handle value, const char* option) {
  std::vector<std::string> names = StringList(value, option);
  return {names.begin(), names.end()};
}

// Pops `key` from `kwargs`; none when absent.
nb::object Take(nb::dict& kwargs, const char* key) {
  if (!kwargs.contains(key)) return nb::none();
  nb::object value = kwargs[key];
  if (PyDict_DelItemString(kwargs.ptr(), key) != 0) throw nb::python_error();
  return value;
}

std::string DeviceKey(nb::handle key) {
  if (nb::isinstance<nb::int_>(key)) return std::to_string(nb::cast<long long>(key));
  return Str(key);
}

}  // namespace

DType ParseDTypeArg(nb::handle value, const char* option) {
  const std::string text = Str(value);
  std::optional<DType> dtype = ParseDType(text);
  if (!dtype) Invalid(std::string(option) + ": unknown dtype '" + text + "'");
  return *dtype;
}

MaxMemory ParseMaxMemory(nb::handle value) {
  if (!nb::isinstance<nb::dict>(value)) Invalid("max_memory: expected a dict {device: size}");
  MaxMemory out;
  for (auto [key, size] : nb::borrow<nb::dict>(value)) {
    SizeValue v;
    if (nb::isinstance<nb::bool_>(size)) {
      Invalid("max_memory[" + DeviceKey(key) + "]: expected bytes or a size string, got a bool");
    } else if (nb::isinstance<nb::int_>(size)) {
      v = nb::cast<int64_t>(size);
    } else if (nb::isinstance<nb::float_>(size)) {
      v = nb::cast<double>(size);
    } else {
      v = Str(size);
    }
    out[DeviceKey(key)] = v;
  }
  return out;
}

DeviceMap ParseDeviceMap(nb::handle value) {
  nb::object items = nb::isinstance<nb::dict>(value) ? nb::borrow<nb::dict>(value).items()
                                                       : nb::borrow<nb::object>(value);
  DeviceMap map;
  for (nb::handle item : nb::iter(items)) {
    auto pair = nb::cast<nb::tuple>(item);
    if (pair.size() != 2) Invalid("device_map: expected (module, device) pairs");
    const std::string prefix = Str(pair[0]);
    nb::handle device = pair[1];
    std::string text = nb::isinstance<nb::int_>(device)
                           ? std::to_string(nb::cast<long long>(device))
                           : Str(device);
    Result<Device> d = ParseDevice(text);
    if (!d.ok()) Invalid("device_map['" + prefix + "']: " + std::string(d.status().message()));
    ThrowIfError(map.Add(prefix, *d));
  }
  return map;
}

std::shared_ptr<const Platform> ParsePlatform(nb::handle value) {
  if (value.is_none()) return Platform::Default();
  if (!nb::isinstance<nb::dict>(value)) {
    Invalid("platform: expected None or {'gpus': [bytes, ...], 'host': bytes}");
  }
  nb::dict spec = nb::borrow<nb::dict>(value);
  SimulatedMachine machine;
  for (auto [key, v] : spec) {
    const std::string k = Str(key);
    if (k == "gpus") {
      for (nb::handle g : nb::iter(v)) machine.gpu_bytes.push_back(nb::cast<uint64_t>(g));
    } else if (k == "host") {
      machine.host_bytes = nb::cast<uint64_t>(v);
    } else {
      Invalid("platform: unknown key '" + k + "' (gpus, host)");
    }
  }
  return Platform::Simulated(machine);
}

void TakeDeviceMapOptions(nb::dict& kwargs, DeviceMapOptions& options) {
  if (nb::object v = Take(kwargs, "platform"); !v.is_none()) options.platform = ParsePlatform(v);
  if (nb::object v = Take(kwargs, "device_map"); !v.is_none()) {
    options.device_map = nb::isinstance<nb::int_>(v) ? std::to_string(nb::cast<long long>(v))
                                                      : Str(v);
  }
  if (nb::object v = Take(kwargs, "max_memory"); !v.is_none()) {
    options.max_memory = ParseMaxMemory(v);
  }
  if (nb::object v = Take(kwargs, "dtype"); !v.is_none()) {
    options.dtype = ParseDTypeArg(v, "dtype");
  }
  // no_split: absent → loadstone's default (numbered blocks); None given → the same; a list
  // (even empty) → exactly those.
  if (nb::object v = Take(kwargs, "no_split"); !v.is_none()) {
    options.no_split = StringList(v, "no_split");
  }
  if (nb::object v = Take(kwargs, "keep_in_fp32"); !v.is_none()) {
    options.keep_in_fp32 = StringList(v, "keep_in_fp32");
  }
  if (nb::object v = Take(kwargs, "special_dtypes"); !v.is_none()) {
    for (auto [name, dtype] : nb::cast<nb::dict>(v)) {
      options.special_dtypes[Str(name)] = ParseDTypeArg(dtype, "special_dtypes");
    }
  }
  if (nb::object v = Take(kwargs, "offload_buffers"); !v.is_none()) {
    options.offload_buffers = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "fallback_allocation"); !v.is_none()) {
    options.fallback_allocation = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "strategy"); !v.is_none()) {
    const std::string s = Str(v);
    if (s == "greedy") {
      options.strategy = PlanStrategy::kGreedy;
    } else if (s == "min-max") {
      options.strategy = PlanStrategy::kMinMax;
    } else {
      Invalid("strategy: 'greedy' (accelerate's) or 'min-max', not '" + s + "'");
    }
  }
  if (nb::object v = Take(kwargs, "clean_result"); !v.is_none()) {
    options.clean_result = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "explain"); !v.is_none()) options.explain = nb::cast<bool>(v);
}

// `order`: "execution", "file", or a list of module prefixes read first (PlanOptions::order).
void TakeOrder(nb::dict& kwargs, PlanOptions& options) {
  nb::object v = Take(kwargs, "order");
  if (v.is_none()) return;
  if (nb::isinstance<nb::str>(v)) {
    const std::string order = Str(v);
    if (order != "execution" && order != "file") {
      throw nb::value_error(("order: '" + order + "' is not \"execution\", \"file\" or a list "
                             "of module prefixes").c_str());
    }
    options.order = order == "file" ? TensorOrder::kFile : TensorOrder::kExecution;
    return;
  }
  options.order = TensorOrder::kGiven;
  options.order_prefixes = StringList(v, "order");
}

PlanOptions ParsePlanOptions(nb::dict kwargs) {
  PlanOptions options;
  TakeDeviceMapOptions(kwargs, options);
  if (nb::object v = Take(kwargs, "explicit_map"); !v.is_none()) {
    options.explicit_map = ParseDeviceMap(v);
  }
  if (nb::object v = Take(kwargs, "model_json"); !v.is_none()) {
    Result<ModelDescription> d = ParseModelDescription(Str(v));
    if (!d.ok()) throw StatusError(d.status().WithContext("model_json"));
    options.model = d->tree;
  }
  if (nb::object v = Take(kwargs, "include"); !v.is_none()) {
    auto names = std::make_shared<const std::unordered_set<std::string>>(NameSet(v, "include"));
    options.include = [names](const TensorInfo& t) { return names->contains(t.name); };
  }
  if (nb::object v = Take(kwargs, "caller_memory"); !v.is_none()) {
    auto names =
        std::make_shared<const std::unordered_set<std::string>>(NameSet(v, "caller_memory"));
    options.caller_memory = [names](const TensorInfo& t) { return names->contains(t.name); };
  }
  if (nb::object v = Take(kwargs, "offload_folder"); !v.is_none()) {
    options.offload_folder = Str(nb::module_::import_("os").attr("fspath")(v));
  }
  if (nb::object v = Take(kwargs, "offload_in_place"); !v.is_none()) {
    options.offload_in_place = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "keep_packed"); !v.is_none()) {
    options.keep_packed = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "pin_cpu_tensors"); !v.is_none()) {
    options.pin_cpu_tensors = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "mmap"); !v.is_none()) options.routes.mmap = nb::cast<bool>(v);
  if (nb::object v = Take(kwargs, "align_tensors"); !v.is_none()) {
    options.routes.align_tensors = nb::cast<bool>(v);
  }
  if (nb::object v = Take(kwargs, "fp8_block"); !v.is_none()) {
    auto block = nb::cast<std::tuple<uint64_t, uint64_t>>(v);
    options.fp8_block = std::array<uint64_t, 2>{std::get<0>(block), std::get<1>(block)};
  }
  TakeOrder(kwargs, options);
  if (nb::object v = Take(kwargs, "max_chunk"); !v.is_none()) {
    options.max_chunk = nb::cast<uint64_t>(v);
  }
  if (kwargs.size() != 0) {
    std::string keys;
    for (auto [k, _] : kwargs) keys += (keys.empty() ? "" : ", ") + Str(k);
    throw nb::type_error(("plan: unknown option(s) " + keys).c_str());
  }
  return options;
}

nb::object DeviceToPython(const Device& device) {
  if (device.is_gpu()) return nb::int_(device.index);
  return nb::str(device.ToString().c_str());
}

nb::dict DeviceMapToPython(const DeviceMap& map) {
  nb::dict out;
  for (const DeviceMap::Entry& e : map.entries()) out[e.prefix.c_str()] = DeviceToPython(e.device);
  return out;
}

nb::list UsageToPython(const DevicePlan& plan) {
  nb::list out;
  for (const DeviceUsage& u : plan.usage) {
    nb::dict d;
    d["device"] = DeviceToPython(u.device);
    d["bytes"] = u.bytes;
    d["budget"] = u.budget ? nb::object(nb::int_(*u.budget)) : nb::none();
    out.append(d);
  }
  return out;
}

}  // namespace loadstone::python
