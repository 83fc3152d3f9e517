// What a CUDA device accepts of a PlaceJob, checked before anything is enqueued.
#ifndef LOADSTONE_CUDA_PLACE_JOB_H_
#define LOADSTONE_CUDA_PLACE_JOB_H_

#include "loadstone/status.h"
#include "runtime/device/accelerator.h"

namespace loadstone::cuda {

// InvalidArgument (naming device `ordinal`) for a job with null memory, a conversion the
// kernels do not do, or a byte count that does not match its element count.
Status CheckPlaceJob(const device::PlaceJob& job, int ordinal);

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_PLACE_JOB_H_
