// The safetensors header: `[u64 LE N][N bytes of JSON][data]`, validated exactly as the
// reference implementation validates it (shared/specs/safetensors.md), plus one deliberate
// difference: duplicate JSON keys are rejected (the reference keeps the last one silently).
#ifndef LOADSTONE_IO_FORMATS_SAFETENSORS_H_
#define LOADSTONE_IO_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/file.h"
#include "io/formats/limits.h"
#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone::io {

// The reference's error names, used in messages ("Corruption: InvalidOffset: ...").
enum class SafetensorsError {
  kHeaderTooSmall,
  kHeaderTooLarge,
  kInvalidHeaderLength,
  kInvalidHeader,
  kInvalidHeaderDeserialization,
  kInvalidOffset,
  kValidationOverflow,
  kMisalignedSlice,
  kTensorInvalidInfo,
  kMetadataIncompleteBuffer,
  kDuplicateKey,  // loadstone only
};
std::string_view SafetensorsErrorName(SafetensorsError error);
// Corruption: "NAME: detail in 'path'" (NAME as the reference names the error).
Status SafetensorsCorruption(SafetensorsError error, std::string_view path,
                             std::string_view detail);

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + N
  // Sorted by offset (ties by name); TensorInfo::file is 0 and offset is absolute.
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Validates the header text `json` (the N bytes after the length prefix) of a file of
// `file_size` bytes. `path` only names the file in messages.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t file_size,
                                                 std::string_view path);

// Reads the length prefix and the header of `file` (and nothing else) and validates them.
Result<SafetensorsHeader> ReadSafetensorsHeader(const File& file);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_SAFETENSORS_H_
