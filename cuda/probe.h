// Asks the CUDA runtime what is there, without failing when nothing is.
#ifndef LOADSTONE_CUDA_PROBE_H_
#define LOADSTONE_CUDA_PROBE_H_

#include <string>

namespace loadstone::cuda {

struct CudaProbeResult {
  int device_count = 0;      // 0 when there is no driver or no device
  int runtime_version = 0;   // e.g. 13000
  std::string reason;        // why device_count is 0 ("no NVIDIA driver is loaded ..."), for the log line
};

CudaProbeResult ProbeCuda();

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_PROBE_H_
