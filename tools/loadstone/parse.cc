#include "tools/loadstone/parse.h"

#include <array>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace loadstone::cli {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string_view::npos;
}

}  // namespace

Result<DType> ParseCastTarget(std::string_view text, std::string_view flag) {
  const std::optional<DType> dtype = ParseDType(text);
  if (!dtype) {
    return Status::InvalidArgument(fmt::format("{} {}: unknown dtype; {} takes {}", flag, text,
                                               flag, kCastTargetSpellings));
  }
  if (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16) {
    return Status::InvalidArgument(fmt::format(
        "{} {}: loadstone does not cast to {} (it casts floating-point tensors to f32, f16 or "
        "bf16; leave {} out to keep every tensor as stored)",
        flag, text, TorchName(*dtype), flag));
  }
  return *dtype;
}

Result<uint64_t> ParseSizeFlag(std::string_view text, std::string_view label,
                               std::string* warning) {
  text = Trim(text);
  if (IsDigits(text)) {
    uint64_t bytes = 0;
    std::from_chars(text.data(), text.data() + text.size(), bytes);
    return bytes;
  }
  auto bytes = ParseSizeString(text);
  if (!bytes.ok()) return Status::InvalidArgument(fmt::format("{}: {}", label, bytes.status().message()));
  const char unit = text.size() >= 2 ? text[text.size() - 2] : ' ';
  if (warning && text.back() == 'b' && std::string_view("kKmMgG").find(unit) != std::string_view::npos) {
    const char upper = static_cast<char>(std::toupper(static_cast<unsigned char>(unit)));
    *warning = fmt::format(
        "{}: a lowercase 'b' means bits, as in accelerate ({} = {} bytes); write {}{}B for bytes",
        label, text, *bytes, text.substr(0, text.size() - 2), upper);
  }
  return *bytes;
}

Result<MaxMemory> ParseMaxMemoryFlag(std::string_view text, std::vector<std::string>* warnings) {
  MaxMemory out;
  std::vector<std::pair<Device, std::string>> seen;  // device → its item, for duplicates
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = Trim(text.substr(start, comma - start));
    start = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(fmt::format(
          "--max-memory: '{}' is not DEVICE=SIZE (e.g. 0=10GiB,cpu=30GiB)", item));
    }
    const std::string key(Trim(item.substr(0, eq)));
    const std::string_view value = Trim(item.substr(eq + 1));
    auto device = ParseDevice(key);
    if (key.empty() || !device.ok() || key == "cuda") {
      return Status::InvalidArgument(fmt::format(
          "--max-memory: '{}' in '{}' is not a device (use 0, 1, ... or cuda:N for GPUs, cpu, "
          "disk, mps)",
          key, item));
    }
    for (const auto& [d, earlier] : seen) {
      if (d == *device) {
        return Status::InvalidArgument(fmt::format(
            "--max-memory gives {} twice ('{}' and '{}'); give each device once", d.ToString(),
            earlier, item));
      }
    }
    seen.push_back({*device, std::string(item)});
    std::string warning;
    LOADSTONE_ASSIGN_OR_RETURN(
        uint64_t bytes, ParseSizeFlag(value, fmt::format("--max-memory {}={}", key, value), &warning));
    if (!warning.empty() && warnings) warnings->push_back(warning);
    if (IsDigits(value)) {
      out[key] = static_cast<int64_t>(bytes);
    } else {
      out[key] = std::string(value);  // the planner reads it as accelerate does
    }
    if (comma == text.size()) break;
  }
  return out;
}

std::vector<std::string> SplitLists(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& value : values) {
    size_t start = 0;
    while (start <= value.size()) {
      const size_t comma = std::min(value.find(',', start), value.size());
      const std::string_view item = Trim(std::string_view(value).substr(start, comma - start));
      if (!item.empty()) out.emplace_back(item);
      start = comma + 1;
    }
  }
  return out;
}

Result<SimulatedMachine> ParseAssumeGpus(std::string_view text,
                                         std::vector<std::string>* warnings) {
  // COUNTxSIZE; the multiplication sign people write (and the docs once did) works too.
  constexpr std::string_view kTimes = "\u00d7";
  size_t x = text.find('x');
  size_t sign = 1;
  if (const size_t times = text.find(kTimes); times < x) {
    x = times;
    sign = kTimes.size();
  }
  const std::string_view count = Trim(text.substr(0, x));
  if (x == std::string_view::npos || !IsDigits(count)) {
    return Status::InvalidArgument(fmt::format(
        "--assume-gpus {}: give COUNTxSIZE, e.g. 2x80GiB (COUNT GPUs, 0 to {}, of SIZE each)",
        text, kMaxAssumedGpus));
  }
  uint64_t n = 0;
  std::from_chars(count.data(), count.data() + count.size(), n);
  if (n > kMaxAssumedGpus) {
    return Status::InvalidArgument(fmt::format(
        "--assume-gpus {}: {} GPUs, and a simulated machine has at most {}", text, n,
        kMaxAssumedGpus));
  }
  const std::string_view size = Trim(text.substr(x + sign));
  std::string warning;
  LOADSTONE_ASSIGN_OR_RETURN(
      uint64_t bytes, ParseSizeFlag(size, fmt::format("--assume-gpus {}", text), &warning));
  if (warnings && !warning.empty()) warnings->push_back(warning);
  if (warnings && IsDigits(size)) {
    warnings->push_back(fmt::format(
        "--assume-gpus {}: a size without a unit is bytes ({} GPUs of {} bytes each); write "
        "{}x{}GiB for GiB",
        text, n, bytes, n, size));
  }
  return SimulatedMachine::Gpus(static_cast<int>(n), bytes);
}

Result<std::array<uint64_t, 2>> ParseBlockFlag(std::string_view text, std::string_view flag) {
  const size_t sep = text.find_first_of(",x");
  std::array<uint64_t, 2> block{};
  if (sep != std::string_view::npos) {
    const std::string_view rows = Trim(text.substr(0, sep)), cols = Trim(text.substr(sep + 1));
    if (IsDigits(rows) && IsDigits(cols)) {
      std::from_chars(rows.data(), rows.data() + rows.size(), block[0]);
      std::from_chars(cols.data(), cols.data() + cols.size(), block[1]);
      if (block[0] > 0 && block[1] > 0) return block;
    }
  }
  return Status::InvalidArgument(fmt::format(
      "{} {}: give ROWS,COLS of one float8 scale block, two positive integers (e.g. 128,128)",
      flag, text));
}

Result<std::string> ReadFlagFile(std::string_view flag, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound(fmt::format("{} {}: no such file", flag, path));
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return Status::IOError(fmt::format("{} {}: cannot read the file", flag, path));
  return text.str();
}

}  // namespace loadstone::cli
