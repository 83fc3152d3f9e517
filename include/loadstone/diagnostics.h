// Diagnostics: measurements of the machine itself, for benchmarks and tools
// (`loadstone bench` reports the raw read ceiling next to every load it times).
#ifndef LOADSTONE_DIAGNOSTICS_H_
#define LOADSTONE_DIAGNOSTICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "loadstone/status.h"

namespace loadstone {

// The raw read ceiling of a set of files: reads every byte into a small scratch ring (nothing is
// kept) with io_uring, O_DIRECT where possible, `queue_depth` reads of `chunk` bytes in flight.
struct RawReadOptions {
  int queue_depth = 32;
  uint64_t chunk = 4ULL << 20;
  bool direct = true;
};
struct RawReadResult {
  uint64_t bytes = 0;
  double seconds = 0;
  std::string backend;
};
Result<RawReadResult> MeasureRawRead(const std::vector<std::string>& paths,
                                     const RawReadOptions& options = {});

}  // namespace loadstone

#endif  // LOADSTONE_DIAGNOSTICS_H_
