#include "dlpack.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <Python.h>

#include "loadstone/device_map.h"

namespace nb = nanobind;

namespace loadstone::python {
namespace {

constexpr DLPackVersion kOurs = {1, 1};

// What one capsule owns: the tensor (its memory), or a host copy, and the shape and strides the
// DLTensor points at.
struct Exported {
  Tensor tensor;
  std::unique_ptr<std::byte[]> copy;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor legacy{};
  DLManagedTensorVersioned versioned{};
};

void DeleteLegacy(DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); }
void DeleteVersioned(DLManagedTensorVersioned* self) {
  delete static_cast<Exported*>(self->manager_ctx);
}

// The capsule's destructor: a capsule no consumer took (still named "dltensor[_versioned]")
// frees what it owns; a consumed one ("used_dltensor[_versioned]") belongs to its consumer.
void DestroyLegacyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}
void DestroyVersionedCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor_versioned")) return;
  auto* m = static_cast<DLManagedTensorVersioned*>(
      PyCapsule_GetPointer(capsule, "dltensor_versioned"));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

[[noreturn]] void BufferError(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw nb::python_error();
}

bool AtLeast(DLPackVersion v, uint32_t major, uint32_t minor) {
  return v.major > major || (v.major == major && v.minor >= minor);
}

alignas(64) std::byte kEmpty[64];  // the data pointer of a tensor with no bytes

}  // namespace

std::optional<DLDataType> DlpackType(DType dtype, DLPackVersion version) {
  const auto bits = static_cast<uint8_t>(DTypeBits(dtype));
  auto code = [&](uint8_t c) { return std::optional<DLDataType>(DLDataType{c, bits, 1}); };
  const bool fp8 = AtLeast(version, 1, 1);
  switch (dtype) {
    case DType::kBool: return code(kDLBool);
    case DType::kU8: case DType::kU16: case DType::kU32: case DType::kU64: return code(kDLUInt);
    case DType::kI8: case DType::kI16: case DType::kI32: case DType::kI64: return code(kDLInt);
    case DType::kF16: case DType::kF32: case DType::kF64: return code(kDLFloat);
    case DType::kBF16: return code(kDLBfloat);
    case DType::kC64: return code(kDLComplex);
    case DType::kF8E4M3: return fp8 ? code(kDLFloat8_e4m3fn) : std::nullopt;
    case DType::kF8E5M2: return fp8 ? code(kDLFloat8_e5m2) : std::nullopt;
    case DType::kF8E4M3FNUZ: return fp8 ? code(kDLFloat8_e4m3fnuz) : std::nullopt;
    case DType::kF8E5M2FNUZ: return fp8 ? code(kDLFloat8_e5m2fnuz) : std::nullopt;
    case DType::kF8E8M0: return fp8 ? code(kDLFloat8_e8m0fnu) : std::nullopt;
    case DType::kF4: case DType::kF6E2M3: case DType::kF6E3M2: return std::nullopt;
  }
  return std::nullopt;
}

DLDevice DlpackDevice(const Tensor& tensor) {
  if (tensor.device() == "cpu") return {kDLCPU, 0};
  Result<Device> d = ParseDevice(tensor.device());
  return {kDLCUDA, d.ok() ? d->index : 0};
}

namespace {

// Tensor `tensor`'s DLPack type in `version`; BufferError when that version has no code for its
// dtype or a dimension is beyond int64.
DLDataType ExportableType(const Tensor& tensor, const DLPackVersion& version) {
  const std::optional<DLDataType> type = DlpackType(tensor.dtype(), version);
  if (!type) {
    BufferError("tensor '" + tensor.name() + "' is " + std::string(TorchName(tensor.dtype())) +
                ", which DLPack " + std::to_string(version.major) + "." +
                std::to_string(version.minor) +
                " has no type code for; take its bytes with .as_bytes() and view them "
                "(loadstone.torch does: torch.from_dlpack(t.as_bytes()).view(dtype))");
  }
  for (uint64_t d : tensor.shape()) {
    if (d > static_cast<uint64_t>(INT64_MAX)) {
      BufferError("tensor '" + tensor.name() + "' has a dimension of " + std::to_string(d) +
                  ", beyond DLPack's int64 shapes");
    }
  }
  return *type;
}

}  // namespace

nb::object ExportDlpack(const Tensor& tensor, const ExportRequest& request) {
  const bool versioned = request.max_version && request.max_version->major >= 1;
  const DLPackVersion version = versioned ? (AtLeast(*request.max_version, 1, 1)
                                                 ? kOurs
                                                 : DLPackVersion{1, 0})
                                          : DLPackVersion{0, 8};
  const DLDataType type = ExportableType(tensor, version);
  auto out = std::make_unique<Exported>();
  out->tensor = tensor;
  out->shape.assign(tensor.shape().begin(), tensor.shape().end());
  out->strides.resize(out->shape.size());
  int64_t stride = 1;
  for (size_t i = out->shape.size(); i-- > 0;) {
    out->strides[i] = stride;
    stride *= out->shape[i] > 0 ? out->shape[i] : 1;
  }
  DLDevice device = DlpackDevice(tensor);
  auto* data = const_cast<std::byte*>(tensor.data());
  uint64_t flags = 0;
  if (request.copy) {
    out->copy = std::make_unique<std::byte[]>(tensor.nbytes() > 0 ? tensor.nbytes() : 1);
    Status s = tensor.CopyToHost({out->copy.get(), tensor.nbytes()});
    if (!s.ok()) BufferError(s.ToString());
    data = out->copy.get();
    device = {kDLCPU, 0};
    flags |= kDLPackFlagIsCopied;
  }
  if (data == nullptr || tensor.nbytes() == 0) data = kEmpty;
  const DLTensor dl{data,
                    device,
                    static_cast<int32_t>(out->shape.size()),
                    type,
                    out->shape.empty() ? nullptr : out->shape.data(),
                    out->strides.empty() ? nullptr : out->strides.data(),
                    0};
  Exported* raw = out.get();
  PyObject* capsule;
  if (versioned) {
    raw->versioned = {version, raw, DeleteVersioned, flags, dl};
    capsule = PyCapsule_New(&raw->versioned, "dltensor_versioned", DestroyVersionedCapsule);
  } else {
    raw->legacy = {dl, raw, DeleteLegacy};
    capsule = PyCapsule_New(&raw->legacy, "dltensor", DestroyLegacyCapsule);
  }
  if (capsule == nullptr) throw nb::python_error();
  out.release();  // the capsule owns it now
  return nb::steal(capsule);
}

}  // namespace loadstone::python
