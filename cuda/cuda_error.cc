#include "cuda/cuda_error.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace loadstone::cuda {
namespace {

// The fix for the errors where one is known; empty otherwise.
std::string_view FixFor(int code) {
  switch (code) {
    case cudaErrorMemoryAllocation:
      return "free GPU memory (other processes: nvidia-smi), lower max_memory for this GPU, or "
             "place part of the model on another device";
    case cudaErrorInsufficientDriver:
      return "install an NVIDIA driver at least as new as the CUDA runtime loadstone was built "
             "with, or build loadstone against an older CUDA toolkit";
    case cudaErrorNoDevice:
      return "check CUDA_VISIBLE_DEVICES and that the driver sees a GPU (nvidia-smi)";
    case cudaErrorInvalidDevice:
      return "use a device index below the number of visible GPUs (nvidia-smi, "
             "CUDA_VISIBLE_DEVICES)";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
      return "rebuild with this GPU's architecture in CMAKE_CUDA_ARCHITECTURES (e.g. 90 for "
             "H100/H200)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      return "the CUDA context is unusable now; restart the process (a loadstone bug if the "
             "addresses came from loadstone: please report it)";
    default:
      return {};
  }
}

StatusCode CodeFor(int code) {
  switch (code) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kOutOfMemory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidResourceHandle:
      return StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return StatusCode::kNotFound;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorNotSupported:
    case cudaErrorCallRequiresNewerDriver:
      return StatusCode::kUnsupported;
    default:
      return StatusCode::kIOError;
  }
}

}  // namespace

std::string DeviceName(int device) {
  return device < 0 ? std::string("cuda") : "cuda:" + std::to_string(device);
}

std::string FormatBytes(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return std::string(buf) + " (" + std::to_string(bytes) + " bytes)";
}

Status CudaErrorStatus(int code, std::string_view name, std::string_view text,
                       const CudaCallContext& where) {
  if (code == cudaSuccess) return Status::OK();
  std::string msg = DeviceName(where.device) + ": " + std::string(where.call);
  if (where.bytes != 0) msg += " of " + FormatBytes(where.bytes);
  msg += " failed: " + std::string(name) + " (" + std::string(text) + ")";
  const std::string_view fix = FixFor(code);
  if (!fix.empty()) msg += "; fix: " + std::string(fix);
  return Status(CodeFor(code), std::move(msg));
}

Status CudaErrorStatus(int code, const CudaCallContext& where) {
  const auto err = static_cast<cudaError_t>(code);
  return CudaErrorStatus(code, cudaGetErrorName(err), cudaGetErrorString(err), where);
}

}  // namespace loadstone::cuda
