#include "py_tensor.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "dlpack.h"
#include "errors.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

[[noreturn]] void BufferError(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw nb::python_error();
}

// The bytes of `t` as a uint8 tensor over the same memory: the last dimension in bytes for a
// type of whole bytes, else one dimension of nbytes. Keeps `t` (its memory) alive.
Tensor AsBytes(const Tensor& t) {
  std::vector<uint64_t> shape;
  const int bits = DTypeBits(t.dtype());
  if (bits % 8 == 0 && !t.shape().empty()) {
    shape = t.shape();
    shape.back() *= static_cast<uint64_t>(bits / 8);
  } else {
    shape = {t.nbytes()};
  }
  auto keep = std::make_shared<Tensor>(t);
  return Tensor(t.name(), DType::kU8, std::move(shape), t.device(), keep, t.mutable_data(),
                t.nbytes());
}

// The stream argument of __dlpack__ as the Python array API defines it: for CUDA None (the
// legacy default stream), -1 (no synchronisation), 1, 2 or a cudaStream_t; 0 is refused as
// ambiguous; for the CPU only None or -1. A loaded tensor's bytes are complete before the
// Tensor exists (its copy and kernels have finished, not merely been queued), so every stream may
// use them at once: nothing is recorded or waited for.
void CheckStream(const Tensor& t, const nb::object& stream) {
  if (stream.is_none()) return;
  if (!nb::isinstance<nb::int_>(stream)) {
    throw nb::type_error("__dlpack__: stream must be an integer or None");
  }
  const long long value = nb::cast<long long>(stream);
  if (DlpackDevice(t).device_type == kDLCPU) {
    if (value != -1) BufferError("__dlpack__: a CPU tensor takes stream=None (or -1)");
  } else if (value == 0) {
    BufferError("__dlpack__: stream=0 is ambiguous for CUDA; pass 1 (legacy default), 2 "
                "(per-thread default), -1 (no synchronisation) or a cudaStream_t");
  }
}

nb::object Dlpack(const Tensor& t, const nb::object& stream, const nb::object& max_version,
                  const nb::object& dl_device, const nb::object& copy) {
  CheckStream(t, stream);
  ExportRequest request;
  if (!max_version.is_none()) {
    auto v = nb::cast<std::tuple<uint32_t, uint32_t>>(max_version);
    request.max_version = DLPackVersion{std::get<0>(v), std::get<1>(v)};
  }
  const DLDevice own = DlpackDevice(t);
  bool other_device = false;
  if (!dl_device.is_none()) {
    auto d = nb::cast<std::tuple<int32_t, int32_t>>(dl_device);
    other_device = std::get<0>(d) != own.device_type ||
                   (own.device_type != kDLCPU && std::get<1>(d) != own.device_id);
    if (other_device && std::get<0>(d) != kDLCPU) {
      BufferError("__dlpack__: tensor '" + t.name() + "' is on " + t.device() +
                  "; loadstone exports it there or copies it to the host (dl_device=(1, 0)), "
                  "nowhere else");
    }
  }
  const std::optional<bool> copy_arg =
      copy.is_none() ? std::nullopt : std::optional<bool>(nb::cast<bool>(copy));
  if (other_device && copy_arg == false) {
    BufferError("__dlpack__: tensor '" + t.name() + "' is on " + t.device() +
                "; a host view needs a copy, and copy=False forbids one");
  }
  request.copy = copy_arg.value_or(false) || other_device;
  return ExportDlpack(t, request);
}

std::string Repr(const Tensor& t) {
  std::string shape;
  for (size_t i = 0; i < t.shape().size(); ++i) {
    shape += (i ? ", " : "") + std::to_string(t.shape()[i]);
  }
  return "loadstone.Tensor('" + t.name() + "', " + std::string(TorchName(t.dtype())) + ", [" +
         shape + "], " + t.device() + ")";
}

}  // namespace

nb::object ToPython(const Tensor& tensor) { return nb::cast(tensor); }

void RegisterTensor(nb::module_& m) {
  nb::class_<Tensor>(m, "Tensor",
                     "A loaded tensor. Keeps its memory alive; hand it to torch, numpy or jax "
                     "with their from_dlpack (no copy).")
      .def_prop_ro("name", &Tensor::name)
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(TorchName(t.dtype())); },
                   "The torch name of its element type: 'bfloat16', 'float8_e4m3fn', ...")
      .def_prop_ro("shape", [](const Tensor& t) {
        nb::list dims;
        for (uint64_t d : t.shape()) dims.append(d);
        return nb::tuple(dims);
      })
      .def_prop_ro("ndim", [](const Tensor& t) { return t.shape().size(); })
      .def_prop_ro("device", &Tensor::device, "'cpu' or 'cuda:N'")
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("data_ptr",
                   [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); })
      .def("__dlpack__", &Dlpack, nb::kw_only(), nb::arg("stream") = nb::none(),
           nb::arg("max_version") = nb::none(), nb::arg("dl_device") = nb::none(),
           nb::arg("copy") = nb::none(),
           "The Python array API's DLPack export: a capsule over this tensor's memory (a "
           "versioned one when max_version >= (1, 0); float8 types need (1, 1)).")
      .def("__dlpack_device__", [](const Tensor& t) {
        const DLDevice d = DlpackDevice(t);
        return std::make_tuple(d.device_type, d.device_id);
      })
      .def("as_bytes", &AsBytes,
           "The same memory as uint8: the last dimension in bytes (one dimension of nbytes for "
           "sub-byte types). For a type a consumer has no DLPack code for (float8 in DLPack "
           "1.0): torch.from_dlpack(t.as_bytes()).view(torch.float8_e4m3fn).")
      .def("tobytes", [](const Tensor& t) {
        std::string bytes(t.nbytes(), '\0');
        Status s;
        {
          nb::gil_scoped_release unlocked;
          s = t.CopyToHost({reinterpret_cast<std::byte*>(bytes.data()), bytes.size()});
        }
        ThrowIfError(s);
        return nb::bytes(bytes.data(), bytes.size());
      }, "A copy of its bytes (from whichever device holds them).")
      .def("__repr__", &Repr);
}

}  // namespace loadstone::python
