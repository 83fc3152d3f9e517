// How the ranks of a distributed call agree before any waits on another (dist.cc, read_mode.cc,
// weight_update.cc): one all-gather of a value per rank.
#ifndef LOADSTONE_BINDINGS_DIST_AGREE_H_
#define LOADSTONE_BINDINGS_DIST_AGREE_H_

#include <cstdint>
#include <string_view>

#include "loadstone/dist.h"

namespace loadstone::dist {

// Every rank's `value` (0: it failed); an error naming the first rank that failed or differs
// from rank 0 — with `stages`, from the first rank of its own pipeline stage, since the stages
// hold different tensors — `own` when this rank failed.
Status Agree(ProcessGroups& groups, const Status& own, uint64_t value, std::string_view what,
             const ParallelOptions* stages = nullptr);

}  // namespace loadstone::dist

#endif  // LOADSTONE_BINDINGS_DIST_AGREE_H_
