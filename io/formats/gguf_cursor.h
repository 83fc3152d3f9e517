// GgufCursor: how io/formats/gguf.cc reads a GGUF header, through a window of the file.
// Private to loadstone_io.
#ifndef LOADSTONE_IO_FORMATS_GGUF_CURSOR_H_
#define LOADSTONE_IO_FORMATS_GGUF_CURSOR_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "io/file.h"
#include "io/formats/limits.h"
#include "loadstone/status.h"

namespace loadstone::io {

// Reads the header through a window of the file; every length is checked against what the file
// still holds before anything is allocated for it.
class GgufCursor {
 public:
  explicit GgufCursor(const File& file) : file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return file_.size() - pos_; }

  Status Fail(std::string_view what) const { return Fail(what, pos_); }
  // Past one of loadstone's bounds (io/formats/limits.h), at byte `at`.
  Status Beyond(std::string_view what, std::string_view bound, uint64_t value, uint64_t at) const {
    return BeyondBound(fmt::format("GGUF '{}' at byte {}", file_.path(), at), what, bound, value);
  }
  Status Fail(std::string_view what, uint64_t at) const {
    return Status::Corruption(
        fmt::format("GGUF '{}': {} (byte {})", file_.path(), what, at));
  }

  Status Bytes(void* out, uint64_t n) {
    if (n > left()) return Fail(fmt::format("the header ends inside a {}-byte field (truncated)", n));
    auto* dst = static_cast<std::byte*>(out);
    while (n > 0) {
      if (pos_ < window_at_ || pos_ >= window_at_ + window_.size()) {
        window_at_ = pos_;
        window_.resize(std::min<uint64_t>(kWindow, left()));
        LOADSTONE_RETURN_IF_ERROR(file_.ReadExact(window_at_, window_));
      }
      const uint64_t in = std::min<uint64_t>(n, window_at_ + window_.size() - pos_);
      std::memcpy(dst, window_.data() + (pos_ - window_at_), in);
      dst += in;
      pos_ += in;
      n -= in;
    }
    return Status::OK();
  }
  template <typename T>
  Result<T> Get() {
    T v{};
    LOADSTONE_RETURN_IF_ERROR(Bytes(&v, sizeof(T)));
    return v;  // little-endian host
  }
  Status Skip(uint64_t n) {
    if (n > left()) return Fail("the header ends inside a value (truncated)");
    pos_ += n;
    return Status::OK();
  }
  // A string of at most `max` bytes (else refused before anything is allocated for it):
  // kGgufMaxString unless the format says less.
  Result<std::string> String(std::string_view what, uint64_t max = kGgufMaxString) {
    LOADSTONE_ASSIGN_OR_RETURN(const uint64_t n, StringLength(what, max));
    std::string s(n, '\0');
    LOADSTONE_RETURN_IF_ERROR(Bytes(s.data(), n));
    return s;
  }
  // A string passed over, never held (array elements beyond those shown).
  Status SkipString(std::string_view what) {
    LOADSTONE_ASSIGN_OR_RETURN(const uint64_t n, StringLength(what, kGgufMaxString));
    return Skip(n);
  }

 private:
  Result<uint64_t> StringLength(std::string_view what, uint64_t max) {
    const uint64_t at = pos_;
    LOADSTONE_ASSIGN_OR_RETURN(uint64_t n, Get<uint64_t>());
    if (n > left()) {
      return Fail(fmt::format("{} of {} bytes: more than the file holds", what, n), at);
    }
    if (n > max && max == kGgufMaxString) {
      return Beyond(fmt::format("{} of {} bytes", what, n), "kGgufMaxString", kGgufMaxString, at);
    }
    if (n > max) {
      return Fail(fmt::format("{} of {} bytes: more than the {} allowed", what, n, max), at);
    }
    return n;
  }

  static constexpr uint64_t kWindow = 1 << 20;
  const File& file_;
  uint64_t pos_ = 0;
  uint64_t window_at_ = 0;
  std::vector<std::byte> window_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_GGUF_CURSOR_H_
