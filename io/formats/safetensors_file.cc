// A safetensors file's header off disk (its length prefix checked first), and the reference's
// error names.
#include <array>
#include <span>
#include <string>

#include <fmt/format.h>

#include "io/formats/limits.h"
#include "io/formats/safetensors.h"

namespace loadstone::io {

std::string_view SafetensorsErrorName(SafetensorsError error) {
  switch (error) {
    case SafetensorsError::kHeaderTooSmall: return "HeaderTooSmall";
    case SafetensorsError::kHeaderTooLarge: return "HeaderTooLarge";
    case SafetensorsError::kInvalidHeaderLength: return "InvalidHeaderLength";
    case SafetensorsError::kInvalidHeader: return "InvalidHeader";
    case SafetensorsError::kInvalidHeaderDeserialization: return "InvalidHeaderDeserialization";
    case SafetensorsError::kInvalidOffset: return "InvalidOffset";
    case SafetensorsError::kValidationOverflow: return "ValidationOverflow";
    case SafetensorsError::kMisalignedSlice: return "MisalignedSlice";
    case SafetensorsError::kTensorInvalidInfo: return "TensorInvalidInfo";
    case SafetensorsError::kMetadataIncompleteBuffer: return "MetadataIncompleteBuffer";
    case SafetensorsError::kDuplicateKey: return "DuplicateKey";
  }
  return "Unknown";
}

Status SafetensorsCorruption(SafetensorsError error, std::string_view path,
                             std::string_view detail) {
  return Status::Corruption(
      fmt::format("{}: {} in '{}'", SafetensorsErrorName(error), detail, path));
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const File& file) {
  const std::string& path = file.path();
  if (file.size() < 8) {
    return SafetensorsCorruption(SafetensorsError::kHeaderTooSmall, path,
                fmt::format("the file has {} bytes, fewer than the 8-byte length prefix",
                            file.size()));
  }
  std::array<std::byte, 8> prefix;
  LOADSTONE_RETURN_IF_ERROR(file.ReadExact(0, prefix));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[i]);
  if (n > kSafetensorsMaxHeader) {
    return SafetensorsCorruption(SafetensorsError::kHeaderTooLarge, path,
                fmt::format("the length prefix says {} header bytes, more than the limit of {}",
                            n, kSafetensorsMaxHeader));
  }
  if (8 + n > file.size()) {
    return SafetensorsCorruption(SafetensorsError::kInvalidHeaderLength, path,
                fmt::format("the length prefix says {} header bytes but the file has only {} "
                            "bytes after the prefix",
                            n, file.size() - 8));
  }
  std::string json(n, '\0');
  LOADSTONE_RETURN_IF_ERROR(
      file.ReadExact(8, std::as_writable_bytes(std::span<char>(json.data(), json.size()))));
  return ParseSafetensorsHeader(json, file.size(), path);
}

}  // namespace loadstone::io
