// Strict JSON for the small documents loadstone reads (index files, model descriptions,
// quantization configs): parse errors carry the position, and duplicate keys are refused.
#ifndef LOADSTONE_IO_FORMATS_JSON_UTIL_H_
#define LOADSTONE_IO_FORMATS_JSON_UTIL_H_

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstone/status.h"

namespace loadstone::io {

// Parses `text`; `what` names the document in errors ("index 'a/model.safetensors.index.json'").
// Errors: Corruption (invalid JSON, a key twice in one object).
Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view what);

// Reads a whole small file (at most `max_bytes`) and parses it with ParseJsonStrict.
Result<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what,
                                            uint64_t max_bytes = 1ULL << 30);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_JSON_UTIL_H_
