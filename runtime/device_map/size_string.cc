// ParseSizeString: accelerate's convert_file_size_to_int, with Python's float() grammar.
#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "loadstone/device_map.h"

namespace loadstone {
namespace {

bool IsPySpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

// Python's float(text): surrounding whitespace, a sign, "inf"/"infinity"/"nan", digits with
// single underscores between digits, an optional fraction and exponent.
std::optional<double> ParsePythonFloat(std::string_view text) {
  while (!text.empty() && IsPySpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsPySpace(text.back())) text.remove_suffix(1);
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (EqualsIgnoreCase(text, "inf") || EqualsIgnoreCase(text, "infinity")) {
    return negative ? -HUGE_VAL : HUGE_VAL;
  }
  if (EqualsIgnoreCase(text, "nan")) return std::nan("");
  std::string clean;
  size_t i = 0;
  // digitpart: digit (["_"] digit)*; returns the number of digits read.
  auto digit_part = [&]() -> int {
    int count = 0;
    while (i < text.size()) {
      char c = text[i];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        clean += c;
        ++count;
        ++i;
      } else if (c == '_' && count > 0 && i + 1 < text.size() &&
                 std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
        ++i;
      } else {
        break;
      }
    }
    return count;
  };
  int int_digits = digit_part();
  int frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    clean += '.';
    ++i;
    frac_digits = digit_part();
  }
  if (int_digits + frac_digits == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    clean += 'e';
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) clean += text[i++];
    if (digit_part() == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  double value = 0;
  auto [ptr, ec] = std::from_chars(clean.data(), clean.data() + clean.size(), value);
  if (ptr != clean.data() + clean.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) value = HUGE_VAL;  // overflow; underflow stays tiny
  return negative ? -value : value;
}

bool EndsWithIgnoreCase(std::string_view text, std::string_view upper_suffix) {
  if (text.size() < upper_suffix.size()) return false;
  std::string_view tail = text.substr(text.size() - upper_suffix.size());
  for (size_t i = 0; i < tail.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(tail[i])) != upper_suffix[i]) return false;
  }
  return true;
}

}  // namespace

Result<uint64_t> ParseSizeString(std::string_view text) {
  auto invalid = [&] {
    return Status::InvalidArgument(fmt::format(
        "`size` {} is not in a valid format. Use an integer for bytes, or a string with an unit "
        "(like '5.0GB').",
        text));
  };
  struct Unit {
    std::string_view suffix;
    double multiplier;
    bool decimal;
  };
  static constexpr Unit kUnits[] = {
      {"GIB", 1073741824.0, false}, {"MIB", 1048576.0, false}, {"KIB", 1024.0, false},
      {"GB", 1e9, true},            {"MB", 1e6, true},         {"KB", 1e3, true},
  };
  for (const Unit& unit : kUnits) {
    if (!EndsWithIgnoreCase(text, unit.suffix)) continue;
    std::optional<double> number = ParsePythonFloat(text.substr(0, text.size() - unit.suffix.size()));
    if (!number || std::isnan(*number)) return invalid();
    double scaled = std::trunc(*number * unit.multiplier);
    if (std::isinf(scaled) || scaled >= 18446744073709551616.0 || scaled < -9.2e18) return invalid();
    if (scaled < 0) return invalid();
    auto bytes = static_cast<uint64_t>(scaled);
    if (unit.decimal && text.back() == 'b') bytes /= 8;
    return bytes;
  }
  return invalid();
}

}  // namespace loadstone
