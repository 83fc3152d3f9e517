// A live progress line on a terminal while a load runs.
#ifndef LOADSTONE_TOOLS_PROGRESS_BAR_H_
#define LOADSTONE_TOOLS_PROGRESS_BAR_H_

#include "loadstone/loader.h"

namespace loadstone::cli {

// Waits for `load` to finish; when `show`, redraws a bar on stderr every 100 ms
// (bytes, GB/s, ETA). Returns the load's final status.
Status WaitWithProgress(const LoadHandle& load, bool show);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_PROGRESS_BAR_H_
