// Strict JSON for the small documents loadstone reads (index files, model descriptions, device
// maps, configs): parse errors carry the position, duplicate keys are refused, nesting and
// numbers are bounded, and no exception of the JSON library gets past this file's functions.
#ifndef LOADSTONE_IO_FORMATS_JSON_UTIL_H_
#define LOADSTONE_IO_FORMATS_JSON_UTIL_H_

#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/limits.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Parses `text`; `what` names the document in errors ("index 'a/model.safetensors.index.json'").
// Errors: Corruption (invalid JSON, a number beyond double's range such as 1e500, a key twice in
// one object, nesting deeper than kMaxJsonDepth).
Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view what);
// The same, keeping each object's keys in document order.
Result<nlohmann::ordered_json> ParseJsonStrictOrdered(std::string_view text, std::string_view what);

// Reads a whole small file of at most `max_bytes`, the value of `bound` (io/formats/limits.h).
// Errors: IOError/NotFound, Unsupported naming the bound (larger, found before reading).
Result<std::string> ReadSmallFile(const std::string& path, std::string_view what,
                                  uint64_t max_bytes, std::string_view bound);

// Reads a whole small file (as ReadSmallFile) and parses it with ParseJsonStrict.
Result<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what,
                                    uint64_t max_bytes, std::string_view bound);

// Runs `interpret`, which turns a parsed document into loadstone's types and returns a Status
// or a Result, and turns any exception of the JSON library it lets out (a type it did not
// check) into a Corruption naming `what`. Every reader of a JSON document goes through here.
template <typename F>
auto InterpretJson(std::string_view what, F&& interpret) -> decltype(interpret()) {
  try {
    return interpret();
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("{} holds a value of an unexpected kind: {}", what, e.what()));
  }
}

// A short description of a value for an error message: its kind and, for scalars, the value
// (strings cut at 64 bytes) — never a recursive dump of whatever an input nested there.
std::string DescribeJsonValue(const nlohmann::json& value);
std::string DescribeJsonValue(const nlohmann::ordered_json& value);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_JSON_UTIL_H_
