// Agreement between ranks (agree.h).
#include "bindings/dist/agree.h"

#include <vector>

#include <fmt/format.h>

namespace loadstone::dist {

Status Agree(ProcessGroups& groups, const Status& own, uint64_t value, std::string_view what,
             const ParallelOptions* stages) {
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<uint64_t> all, groups.AllGather(own.ok() ? value : 0));
  LOADSTONE_RETURN_IF_ERROR(own);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) {
      return Status::IOError(fmt::format(
          "rank {} failed ({}; its own error says why); rank {} stops too", r, what,
          groups.options().rank));
    }
    const int tp = stages != nullptr ? stages->tp : 1;
    const int pp = stages != nullptr ? stages->pp : 1;
    const size_t ref = stages != nullptr ? ((static_cast<int>(r) / tp) % pp) * tp : 0;
    if (all[r] != all[ref]) {
      return Status::InvalidArgument(fmt::format(
          "rank {}'s {} differs from rank {}'s: every rank must be given the same", r, what,
          ref));
    }
  }
  return Status::OK();
}


}  // namespace loadstone::dist
