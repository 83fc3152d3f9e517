// DLPack: the exchange of loaded tensors with torch, numpy, jax and any other consumer of the
// Python array API's `__dlpack__` protocol, without a copy.
//
// The structs below are the DLPack ABI (https://dmlc.github.io/dlpack/latest/, versions 0.8 to
// 1.1), declared here so that the extension needs no header from another project. A capsule
// made by ExportDlpack owns a copy of the loadstone::Tensor (so loadstone's buffer lives until
// the consumer's deleter runs, on whatever thread the consumer drops it) and no Python object.
#ifndef LOADSTONE_PYTHON_DLPACK_H_
#define LOADSTONE_PYTHON_DLPACK_H_

#include <cstdint>
#include <optional>
#include <utility>

#include <nanobind/nanobind.h>

#include "loadstone/loader.h"

namespace loadstone::python {

// ---- the ABI -------------------------------------------------------------------------------

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};

// Type codes. 0-6 since DLPack 0.8; the float8/6/4 codes since 1.1.
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14,
  kDLFloat6_e2m3fn = 15,
  kDLFloat6_e3m2fn = 16,
  kDLFloat4_e2m1fn = 17,
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: C-contiguous
  uint64_t byte_offset;
};

// The unversioned capsule ("dltensor"), for consumers that do not pass max_version.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

inline constexpr uint64_t kDLPackFlagReadOnly = 1ULL << 0;
inline constexpr uint64_t kDLPackFlagIsCopied = 1ULL << 1;

// The versioned capsule ("dltensor_versioned"), DLPack >= 1.0.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

// ---- loadstone's side ----------------------------------------------------------------------

// The DLPack type of `dtype` in a capsule of version (major, minor): nullopt when that version
// has no code for it (float8 before 1.1) or DLPack none at all (sub-byte floats are refused:
// their element shape is not the byte shape loadstone holds).
std::optional<DLDataType> DlpackType(DType dtype, DLPackVersion version);

// The device (type, id) of a loaded tensor: "cpu" is kDLCPU 0, "cuda:N" kDLCUDA N.
DLDevice DlpackDevice(const Tensor& tensor);

struct ExportRequest {
  std::optional<DLPackVersion> max_version;  // unset: the unversioned capsule
  bool copy = false;  // a host copy the capsule owns (from any device), instead of the tensor
};

// A PyCapsule over `tensor` (or, with request.copy, over a host copy of it). Errors raise
// Python's BufferError with the reason: a dtype the requested version cannot name, a failed
// copy.
nanobind::object ExportDlpack(const Tensor& tensor, const ExportRequest& request);

}  // namespace loadstone::python

#endif  // LOADSTONE_PYTHON_DLPACK_H_
