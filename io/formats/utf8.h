// Strict UTF-8 validation (as Rust's str::from_utf8: no overlong forms, no surrogates, nothing
// above U+10FFFF).
#ifndef LOADSTONE_IO_FORMATS_UTF8_H_
#define LOADSTONE_IO_FORMATS_UTF8_H_

#include <cstddef>
#include <string_view>

namespace loadstone::io {

// The index of the first byte that starts an invalid sequence, or npos when `text` is valid.
size_t FindInvalidUtf8(std::string_view text);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_UTF8_H_
