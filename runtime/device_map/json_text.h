// JSON text as Python's json.dumps writes it (ensure_ascii), for output that equals accelerate's.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_JSON_TEXT_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_JSON_TEXT_H_

#include <string>
#include <string_view>

namespace loadstone::device_map {

// `"text"` with json.dumps escaping: \" \\ \n \r \t \b \f, other control characters and every
// non-ASCII code point as \uXXXX (UTF-16 surrogate pairs above U+FFFF). Invalid UTF-8 bytes are
// written as U+FFFD.
std::string JsonString(std::string_view text);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_JSON_TEXT_H_
