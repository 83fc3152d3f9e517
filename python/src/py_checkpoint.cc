// loadstone._core.Checkpoint (the catalog: headers only) and Plan (what a load will do).
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "errors.h"
#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "loadstone/state_dict.h"
#include "options.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

std::string Path(nb::handle path) {
  return nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(path));
}

nb::list Dims(const std::vector<uint64_t>& shape) {
  nb::list out;
  for (uint64_t d : shape) out.append(d);
  return out;
}

nb::dict Info(const TensorInfo& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = std::string(TorchName(t.dtype));
  d["safetensors_dtype"] = std::string(SafetensorsName(t.dtype));
  d["bits"] = DTypeBits(t.dtype);
  d["shape"] = Dims(t.shape);
  d["file"] = t.file;
  d["offset"] = t.offset;
  d["nbytes"] = t.nbytes;
  d["plain"] = t.plain_layout();
  d["packed"] = t.packed ? nb::object(nb::str(t.packed->scheme.c_str())) : nb::none();
  d["element_shape"] = Dims(t.packed ? t.packed->element_shape : t.shape);
  d["state_dict_name"] = t.decoded_name();
  return d;
}

const TensorInfo& Find(const Checkpoint& c, const std::string& name) {
  const TensorInfo* t = c.Find(name);
  if (t == nullptr) throw StatusError(Status::NotFound("no tensor '" + name + "' in the checkpoint"));
  return *t;
}

// view(): a catalog of byte ranges of this checkpoint's files, each {name, dtype, shape, file,
// offset, nbytes}.
Checkpoint View(const Checkpoint& c, nb::iterable specs) {
  std::vector<TensorInfo> tensors;
  for (nb::handle s : specs) {
    nb::dict d = nb::cast<nb::dict>(s);
    TensorInfo t;
    t.name = nb::cast<std::string>(d["name"]);
    t.dtype = ParseDTypeArg(d["dtype"], "view: dtype");
    for (nb::handle dim : nb::iter(d["shape"])) t.shape.push_back(nb::cast<uint64_t>(dim));
    t.file = nb::cast<uint32_t>(d["file"]);
    t.offset = nb::cast<uint64_t>(d["offset"]);
    t.nbytes = nb::cast<uint64_t>(d["nbytes"]);
    tensors.push_back(std::move(t));
  }
  return ValueOrThrow(c.WithTensors(std::move(tensors)));
}

nb::list PlanTensors(const PyPlan& p) {
  nb::list out;
  const auto& infos = p.checkpoint.tensors();
  for (uint32_t i = 0; i < p.plan->tensors.size(); ++i) {
    const TensorPlan& tp = p.plan->tensors[i];
    const TensorInfo& src = infos[tp.source];
    nb::dict d;
    d["name"] = src.name;
    d["state_dict_name"] = Unpacks(tp.conversion) ? src.decoded_name() : src.name;
    d["device"] = p.plan->device_of(i).ToString();
    d["dtype"] = std::string(TorchName(tp.dtype));
    d["conversion"] = std::string(ConversionName(tp.conversion));
    d["conversion_site"] = std::string(ConversionSiteName(tp.conversion_site));
    d["memory"] = std::string(TensorMemoryName(tp.memory));
    d["nbytes"] = tp.nbytes;
    out.append(d);
  }
  return out;
}

nb::list PlanOffloaded(const PyPlan& p) {
  nb::list out;
  const auto& infos = p.checkpoint.tensors();
  for (const OffloadPlan& o : p.plan->offloaded) {
    nb::dict d;
    d["name"] = infos[o.source].name;
    d["dtype"] = std::string(TorchName(o.dtype));
    d["shape"] = Dims(o.shape);
    d["in_place"] = o.in_place;
    d["nbytes"] = o.nbytes;
    out.append(d);
  }
  return out;
}

// match_state_dict(): MatchStateDict over [(key, shape, floating)].
nb::dict MatchKeys(const Checkpoint& c, nb::iterable model) {
  std::vector<ModelKey> keys;
  for (nb::handle entry : model) {
    auto [name, shape, floating] = nb::cast<std::tuple<std::string, nb::object, bool>>(entry);
    ModelKey key{std::move(name), {}, floating};
    for (nb::handle d : nb::iter(shape)) key.shape.push_back(nb::cast<uint64_t>(d));
    keys.push_back(std::move(key));
  }
  const KeyMatch match = MatchStateDict(c, keys);
  nb::list fills, mismatched;
  for (const KeyFill& f : match.fills) {
    fills.append(nb::make_tuple(f.key, c.tensors()[f.tensor].name, f.dequantized));
  }
  for (const ShapeMismatch& mm : match.mismatched) {
    mismatched.append(nb::make_tuple(mm.key, Dims(mm.expected), Dims(mm.found)));
  }
  nb::dict out;
  out["fills"] = fills;
  out["missing"] = match.missing;
  out["unexpected"] = match.unexpected;
  out["mismatched"] = mismatched;
  return out;
}

// loadstone._core.Checkpoint.
void RegisterCheckpointClass(nb::module_& m) {
  nb::class_<Checkpoint>(m, "Checkpoint", "A checkpoint's catalog: headers only, never a data byte.")
      .def_static(
          "open",
          [](nb::handle path, const std::string& variant, const std::string& subfolder,
             bool as_stored) {
            const std::string p = Path(path);
            OpenOptions options{variant, subfolder, as_stored};
            nb::gil_scoped_release unlocked;
            return ValueOrThrow(Checkpoint::Open(p, options));
          },
          nb::arg("path"), nb::arg("variant") = "", nb::arg("subfolder") = "",
          nb::arg("as_stored") = false,
          "as_stored: every tensor as its file stores it (no quantized layout recognised), as "
          "safetensors sees a file.")
      .def_prop_ro("format", [](const Checkpoint& c) {
        return std::string(CheckpointFormatName(c.format()));
      })
      .def_prop_ro("files", [](const Checkpoint& c) {
        nb::list out;
        for (const CheckpointFile& f : c.files()) out.append(nb::make_tuple(f.path, f.bytes));
        return out;
      })
      .def_prop_ro("metadata", &Checkpoint::metadata)
      .def_prop_ro("index_path", &Checkpoint::index_path)
      .def_prop_ro("resolution", &Checkpoint::resolution)
      .def_prop_ro("warnings", &Checkpoint::warnings)
      .def_prop_ro("total_bytes", &Checkpoint::total_bytes)
      .def_prop_ro("fingerprint", &Checkpoint::fingerprint)
      .def_prop_ro("quant_method", [](const Checkpoint& c) { return c.config().quant_method; })
      .def("keys", [](const Checkpoint& c) {
        nb::list out;
        for (const TensorInfo& t : c.tensors()) out.append(t.name);
        return out;
      }, "Every tensor name, in file order, then offset order within a file.")
      .def("__len__", [](const Checkpoint& c) { return c.tensors().size(); })
      .def("__contains__", [](const Checkpoint& c, const std::string& n) {
        return c.Find(n) != nullptr;
      })
      .def("info", [](const Checkpoint& c, const std::string& n) { return Info(Find(c, n)); })
      .def("infos", [](const Checkpoint& c) {
        nb::list out;
        for (const TensorInfo& t : c.tensors()) out.append(Info(t));
        return out;
      })
      .def("dequantizes", [](const Checkpoint& c, const std::string& n) {
        return c.Dequantizes(Find(c, n));
      }, "True when a floating-point target dequantizes this tensor (packed, or float8 with scales).")
      .def("companions", [](const Checkpoint& c, const std::string& n) {
        nb::list out;
        for (const TensorInfo* t : ValueOrThrow(c.Companions(Find(c, n)))) out.append(t->name);
        return out;
      }, "The tensors read with this quantized weight to dequantize it (its quant state or "
         "float8 scales), in order; [] for none.")
      .def("view", &View, nb::arg("tensors"),
           "A catalog over the same files listing these byte ranges instead: dicts {name, "
           "dtype, shape, file, offset, nbytes}.");
}

// loadstone._core.match_state_dict, Plan and plan.
void RegisterPlan(nb::module_& m) {
  m.def("match_state_dict", &MatchKeys, nb::arg("checkpoint"), nb::arg("model"),
        "Which checkpoint tensor fills which key of a model's state dict (model: [(key, shape, "
        "floating)]): {fills: [(key, tensor, dequantized)], missing, unexpected, mismatched: "
        "[(key, expected, found)]}.");

  nb::class_<PyPlan>(m, "Plan", "What a load will do: pure data.")
      .def_prop_ro("device_map", [](const PyPlan& p) {
        return DeviceMapToPython(p.plan->devices.device_map);
      })
      .def_prop_ro("tensors", &PlanTensors)
      .def_prop_ro("offloaded", &PlanOffloaded)
      .def_prop_ro("usage", [](const PyPlan& p) { return UsageToPython(p.plan->devices); })
      .def_prop_ro("no_split", [](const PyPlan& p) { return p.plan->devices.no_split; })
      .def_prop_ro("warnings", [](const PyPlan& p) { return p.plan->warnings; })
      .def_prop_ro("read_bytes", [](const PyPlan& p) { return p.plan->read_bytes; })
      .def_prop_ro("placed_bytes", [](const PyPlan& p) { return p.plan->placed_bytes; })
      .def_prop_ro("offloaded_bytes", [](const PyPlan& p) { return p.plan->offloaded_bytes; })
      .def_prop_ro("offload_folder", [](const PyPlan& p) { return p.plan->offload_folder; })
      .def("__str__", [](const PyPlan& p) { return p.plan->ToString(); });

  m.def(
      "plan",
      [](const Checkpoint& checkpoint, nb::kwargs kwargs) {
        PlanOptions options = ParsePlanOptions(kwargs);
        Result<LoadPlan> plan = [&] {
          nb::gil_scoped_release unlocked;
          return Plan(checkpoint, options);
        }();
        return PyPlan{checkpoint, std::make_shared<const LoadPlan>(ValueOrThrow(std::move(plan)))};
      },
      nb::arg("checkpoint"), nb::arg("kwargs"),
      "Plans a load of `checkpoint` (options: see loadstone._core.plan's docs in "
      "loadstone/__init__.py).");
}

}  // namespace

void RegisterCheckpoint(nb::module_& m) {
  RegisterCheckpointClass(m);
  RegisterPlan(m);
}

}  // namespace loadstone::python
