// CUDA errors as loadstone Statuses: one helper, so that every failure names the call, the
// device and, when one is known, the fix. No CUDA types here: the code is the plain integer
// value of a cudaError_t, so that this header (and its tests) need no CUDA headers.
#ifndef LOADSTONE_CUDA_CUDA_ERROR_H_
#define LOADSTONE_CUDA_CUDA_ERROR_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "loadstone/status.h"

namespace loadstone::cuda {

// What a failed call was doing, for the message. `device` < 0: no particular device.
struct CudaCallContext {
  std::string_view call;   // "cudaMalloc", "cast kernel bf16->f16", ...
  int device = -1;         // the ordinal: "cuda:N" in the message
  uint64_t bytes = 0;      // the size involved (allocations, copies); 0: not said
};

// OK for cudaSuccess (0). Otherwise a Status whose code follows the error:
//   out of memory -> OutOfMemory (naming the device and the size);
//   invalid value / pointer / configuration -> InvalidArgument;
//   no device, invalid device -> NotFound; no driver, driver too old, no kernel image for this
//   GPU, not supported -> Unsupported; everything else (launch failures, illegal addresses,
//   ECC, a lost context) -> IOError.
// `name` and `text` are cudaGetErrorName / cudaGetErrorString of the code.
Status CudaErrorStatus(int code, std::string_view name, std::string_view text,
                       const CudaCallContext& where);

// The same for a code from this process's CUDA runtime (looks up the name and text itself).
Status CudaErrorStatus(int code, const CudaCallContext& where);

// "cuda:3" (or "cuda" when device < 0).
std::string DeviceName(int device);

// "1.50 GiB (1610612736 bytes)".
std::string FormatBytes(uint64_t bytes);

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_CUDA_ERROR_H_
