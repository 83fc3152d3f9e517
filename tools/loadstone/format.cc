#include "tools/loadstone/format.h"

#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loadstone::cli {

int ReportError(const Status& status) {
  std::cerr << "error: " << status.ToString() << "\n";
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

}  // namespace loadstone::cli
