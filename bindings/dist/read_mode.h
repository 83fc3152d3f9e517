// ReadMode::kAuto (loadstone/tensor_parallel.h): each group measures its link and its storage,
// and every rank of it takes the same mode from EstimateReadModes.
#ifndef LOADSTONE_BINDINGS_DIST_READ_MODE_H_
#define LOADSTONE_BINDINGS_DIST_READ_MODE_H_

#include <cstdint>

#include "loadstone/dist.h"

namespace loadstone::dist {

struct ReadModeChoice {
  ReadMode mode = ReadMode::kEachRank;
  double read_bytes_per_s = 0;  // measured by the group's first rank
  double link_bytes_per_s = 0;  // the slowest of the group's ranks
  ReadModeCost cost;
  uint64_t probe_bytes = 0;     // what this rank read to measure (read again by the load)
};

// Measures, then chooses for `each` (this rank's kEachRank share, already agreed on): the link as
// one all-to-all of kLinkProbeBytes to each other rank of the group (after one to warm it), the
// storage as the group's first rank's load of the first kReadProbeBytes or so of its share; both
// all-gathered over the world so that every rank of a group decides alike. A group of one reads
// each (the modes are the same). Errors: a rank that failed to measure (IOError naming it), the
// exchange's.
inline constexpr uint64_t kLinkProbeBytes = 4ULL << 20;
inline constexpr uint64_t kReadProbeBytes = 32ULL << 20;
Result<ReadModeChoice> ChooseReadMode(Loader& loader, const RankShare& each,
                                      const PlanOptions& options, ProcessGroups& groups);

}  // namespace loadstone::dist

#endif  // LOADSTONE_BINDINGS_DIST_READ_MODE_H_
