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

// A share of a file's pages this much in the page cache counts as cached: its bytes are copied
// (or mapped) from there rather than read from the device (set just above the break-even share
// measured in docs/pipeline.md). The Loader's own rule for a read's bytes (docs/pipeline.md), and the Python
// patches' rule for mapping a file from_pretrained reads (docs/python.md).
inline constexpr double kMostlyCached = 0.75;

// The share of the pages of the file at `path` that are in the page cache now, 0..1: cachestat(2)
// where the kernel has it, else mincore(2) over a mapping of the file; nothing is read. 0 when it
// cannot be told. Errors: NotFound, IOError (the file cannot be opened).
Result<double> CachedFraction(const std::string& path);

}  // namespace loadstone

#endif  // LOADSTONE_DIAGNOSTICS_H_
