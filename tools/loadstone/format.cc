#include "tools/loadstone/format.h"

#include <zlib.h>

#include <algorithm>
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

nlohmann::ordered_json RoutesJson(const RouteCounts& counts) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r].reads == 0) continue;
    out[std::string(ReadRouteName(static_cast<ReadRoute>(r)))] = {{"reads", counts[r].reads},
                                                                 {"bytes", counts[r].bytes}};
  }
  return out;
}

std::string ReadSources(const ReadStats& rs) {
  const uint64_t copied = rs.taken(ReadRoute::kPageCacheCopy).bytes;
  if (rs.network_bytes > 0 && rs.direct_bytes == 0 && rs.buffered_bytes == 0) {
    return fmt::format("{} over the network ({} range{} retried)", HumanBytes(rs.network_bytes),
                       rs.resubmits, rs.resubmits == 1 ? "" : "s");
  }
  return fmt::format(
      "{} from the device with O_DIRECT, {} from the page cache ({} of it copied by the workers "
      "into fresh pages)",
      HumanBytes(rs.direct_bytes), HumanBytes(rs.buffered_bytes + copied), HumanBytes(copied));
}

std::string Wrapped(std::string_view text, size_t width, std::string_view indent) {
  std::string out, line(indent);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    start = end + 1;
    if (word.empty()) continue;
    if (line.size() > indent.size() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (line.size() > indent.size()) line += ' ';
    line += word;
  }
  if (line.size() > indent.size()) out += line + "\n";
  return out;
}

Result<uint32_t> Crc32(const loadstone::Tensor& t) {
  std::vector<std::byte> host;
  const std::byte* p = t.data();
  if (t.device() != "cpu") {
    host.resize(t.nbytes());
    LOADSTONE_RETURN_IF_ERROR(t.CopyToHost(host));
    p = host.data();
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t left = t.nbytes(); left > 0;) {
    const uInt n = static_cast<uInt>(std::min<uint64_t>(left, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace loadstone::cli
