// Small helpers shared by the CLI commands: errors, byte counts, shapes.
#ifndef LOADSTONE_TOOLS_FORMAT_H_
#define LOADSTONE_TOOLS_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"

namespace loadstone::cli {

// Prints `error: <Code>: <message>` on stderr and returns the exit code 1.
int ReportError(const Status& status);

// "1.50 GiB", "512 B".
std::string HumanBytes(uint64_t bytes);

// "[4096, 4096]".
std::string ShapeString(const std::vector<uint64_t>& shape);

// `text` broken at spaces into lines of at most `width` columns, each starting with `indent`
// (a word longer than a line stands alone), each ended by a newline.
std::string Wrapped(std::string_view text, size_t width, std::string_view indent);

// Where a load's bytes came from: "X from the device with O_DIRECT, Y from the page cache (Z of
// it copied by the workers into fresh pages)".
std::string ReadSources(const ReadStats& stats);

// {"in place": {"reads": N, "bytes": B}, ...}: the routes with reads, in ReadRoute order
// (`plan --json` for the planned routes, `load --json` for those taken).
nlohmann::ordered_json RoutesJson(const RouteCounts& counts);

// zlib's CRC-32 of the tensor's bytes, copied back from its device when it is not on the host.
Result<uint32_t> Crc32(const loadstone::Tensor& t);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_FORMAT_H_
