#include "cuda/place_job.h"

#include <string>

#include "cuda/cast_kernels.h"
#include "cuda/dequant_kernels.h"
#include "cuda/cuda_error.h"
#include "runtime/convert/cast.h"

namespace loadstone::cuda {

Status CheckPlaceJob(const device::PlaceJob& job, int ordinal) {
  const std::string dev = DeviceName(ordinal);
  if (job.bytes != 0 && (job.src == nullptr || job.dst == nullptr)) {
    return Status::InvalidArgument(dev + ": a job of " + std::to_string(job.bytes) +
                                   " bytes with a null source or destination");
  }
  if (!device::Converts(job)) return Status::OK();
  if (job.quant != nullptr) {  // packed bytes in, `count` elements of `to` out
    if (!CanDequantOnDevice(job.to) || job.count == 0 || job.bytes == 0) {
      return Status::InvalidArgument(dev + ": cannot decode " + job.quant->layout.scheme + " into " +
                                     std::string(TorchName(job.to)) + " (" +
                                     std::to_string(job.count) + " elements) on the device");
    }
    return Status::OK();
  }
  const bool fp8 = job.fp8.scales != nullptr;
  if (fp8 ? !CanDequantFp8BlockOnDevice(job.from, job.to) : !CanCastOnDevice(job.from, job.to)) {
    return Status::InvalidArgument(dev + ": cannot convert " + std::string(TorchName(job.from)) +
                                   " to " + std::string(TorchName(job.to)) + " on the device");
  }
  if (job.bytes != convert::ElementBytes(job.from, job.count)) {
    return Status::InvalidArgument(
        dev + ": a job of " + std::to_string(job.count) + " " +
        std::string(TorchName(job.from)) + " elements must be " +
        std::to_string(convert::ElementBytes(job.from, job.count)) + " bytes, not " +
        std::to_string(job.bytes));
  }
  return Status::OK();
}

}  // namespace loadstone::cuda
