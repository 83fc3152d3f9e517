// Small helpers shared by the CLI commands: errors, byte counts, shapes.
#ifndef LOADSTONE_TOOLS_FORMAT_H_
#define LOADSTONE_TOOLS_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "loadstone/status.h"

namespace loadstone::cli {

// Prints `error: <Code>: <message>` on stderr and returns the exit code 1.
int ReportError(const Status& status);

// "1.50 GiB", "512 B".
std::string HumanBytes(uint64_t bytes);

// "[4096, 4096]".
std::string ShapeString(const std::vector<uint64_t>& shape);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_FORMAT_H_
