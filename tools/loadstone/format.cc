#include "tools/loadstone/format.h"

#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loadstone::cli {

int ReportError(const Status& status) {
  // One line whatever the message holds (tensor names may contain control characters).
  std::string line;
  for (unsigned char c : status.ToString()) {
    if (c == '\n') {
      line += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      line += fmt::format("\\x{:02x}", c);
    } else {
      line += static_cast<char>(c);
    }
  }
  std::cerr << "error: " << line << "\n";
  return 1;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, kUnits[unit]);
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// "0=10GiB,1=10GiB,cpu=30GiB": digits alone are bytes, anything else a size string.
Result<MaxMemory> ParseMaxMemoryFlag(const std::string& text) {
  MaxMemory out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      return Status::InvalidArgument(fmt::format(
          "--max-memory: '{}' is not DEVICE=SIZE (e.g. 0=10GiB,cpu=30GiB)", item));
    }
    std::string value = item.substr(eq + 1);
    bool digits = value.find_first_not_of("0123456789") == std::string::npos && value.size() <= 18;
    if (digits) {
      out[item.substr(0, eq)] = static_cast<int64_t>(std::stoll(value));
    } else {
      out[item.substr(0, eq)] = value;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace loadstone::cli
