#include "io/formats/limits.h"

#include <fmt/format.h>

namespace loadstone::io {

Status BeyondBound(std::string_view where, std::string_view what, std::string_view bound,
                   uint64_t value) {
  return Status::Unsupported(fmt::format(
      "{}: {} is beyond loadstone's bound {} = {} (io/formats/limits.h), far above what the "
      "producers write: refused before what it asks for is allocated",
      where, what, bound, value));
}

}  // namespace loadstone::io
