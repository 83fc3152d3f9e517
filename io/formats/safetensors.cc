#include "io/formats/safetensors.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "io/formats/json_scan.h"
#include "io/formats/limits.h"
#include "io/formats/safetensors_sax.h"
#include "io/formats/utf8.h"

namespace loadstone::io {
namespace {

using safetensors_sax::Fail;
using safetensors_sax::HeaderSax;

// Puts (*v)[order[k]] at k for every k, each element moved once (no second vector of them).
void InOrder(std::vector<size_t>& order, std::vector<TensorInfo>* v) {
  for (size_t k = 0; k < order.size(); ++k) {
    if (order[k] == k) continue;
    TensorInfo first = std::move((*v)[k]);
    size_t j = k;
    while (order[j] != k) {  // follow the cycle through k
      const size_t from = order[j];
      (*v)[j] = std::move((*v)[from]);
      order[j] = j;
      j = from;
    }
    (*v)[j] = std::move(first);
    order[j] = j;
  }
}

// Tensor `t`'s data_offsets [begin, end) hold exactly its shape of its dtype.
Status CheckSize(const TensorInfo& t, uint64_t begin, uint64_t end, std::string_view path) {
  uint64_t numel = 1;
  for (uint64_t d : t.shape) {
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return Fail(SafetensorsError::kValidationOverflow, path,
                  fmt::format("tensor '{}': the element count of its shape overflows", t.name));
    }
  }
  uint64_t bits;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeBits(t.dtype)), &bits)) {
    return Fail(SafetensorsError::kValidationOverflow, path,
                fmt::format("tensor '{}': its size in bits overflows", t.name));
  }
  if (bits % 8 != 0) {
    return Fail(SafetensorsError::kMisalignedSlice, path,
                fmt::format("tensor '{}' ({} x {}) does not end on a byte boundary", t.name,
                            numel, SafetensorsName(t.dtype)));
  }
  if (end - begin != bits / 8) {
    return Fail(SafetensorsError::kTensorInvalidInfo, path,
                fmt::format("tensor '{}' {} with {} elements needs {} bytes, data_offsets "
                            "[{}, {}] give {}",
                            t.name, SafetensorsName(t.dtype), numel, bits / 8, begin, end,
                            end - begin));
  }
  return Status::OK();
}

// Checks offsets, sizes and coverage in the reference's order; fills offset and nbytes.
Status Validate(HeaderSax& sax, uint64_t header_len, uint64_t file_size, std::string_view path,
                SafetensorsHeader* out) {
  const uint64_t data_start = 8 + header_len;
  std::vector<size_t> order(sax.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& [a0, a1] = sax.offsets[a];
    const auto& [b0, b1] = sax.offsets[b];
    if (a0 != b0) return a0 < b0;
    if (a1 != b1) return a1 < b1;
    return sax.tensors[a].name < sax.tensors[b].name;
  });
  uint64_t end_so_far = 0;
  for (size_t i : order) {
    TensorInfo& t = sax.tensors[i];
    const auto [begin, end] = sax.offsets[i];
    if (begin != end_so_far || end < begin) {
      return Fail(SafetensorsError::kInvalidOffset, path,
                  fmt::format("tensor '{}' data_offsets [{}, {}]: expected it to begin at {} "
                              "(tensors must tile the data section without gaps or overlaps)",
                              t.name, begin, end, end_so_far));
    }
    end_so_far = end;
    LOADSTONE_RETURN_IF_ERROR(CheckSize(t, begin, end, path));
    t.offset = data_start + begin;
    t.nbytes = end - begin;
  }
  uint64_t covered;
  if (__builtin_add_overflow(end_so_far, data_start, &covered) || covered != file_size) {
    return Fail(SafetensorsError::kMetadataIncompleteBuffer, path,
                fmt::format("header + tensors cover {} + {} bytes, the file has {} (truncated "
                            "file, or bytes after the last tensor)",
                            data_start, end_so_far, file_size));
  }
  InOrder(order, &sax.tensors);
  out->tensors = std::move(sax.tensors);
  out->data_start = data_start;
  out->metadata = std::move(sax.metadata);
  return Status::OK();
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t file_size,
                                                 std::string_view path) {
  if (size_t bad = FindInvalidUtf8(json); bad != std::string_view::npos) {
    return Fail(SafetensorsError::kInvalidHeader, path,
                fmt::format("the header is not valid UTF-8 (byte {} of the header)", bad));
  }
  // nlohmann stops at a NUL byte and skips a leading byte-order mark; serde_json rejects both.
  if (size_t nul = json.find('\0'); nul != std::string_view::npos) {
    return Fail(SafetensorsError::kInvalidHeaderDeserialization, path,
                fmt::format("invalid JSON: a NUL byte at header byte {}", nul));
  }
  if (json.substr(0, 3) == "\xEF\xBB\xBF") {
    return Fail(SafetensorsError::kInvalidHeaderDeserialization, path,
                "invalid JSON: the header starts with a byte-order mark");
  }
  // At most one tensor per 50 header bytes (the least a tensor's entry takes): the room reserved
  // is address space, touched only as far as the header fills it.
  const auto fresh = [json, path](bool keys_checked) {
    HeaderSax sax(path, keys_checked);
    sax.tensors.reserve(std::min<uint64_t>(json.size() / 50, kMaxTensorsPerFile));
    return sax;
  };
  HeaderSax sax = fresh(false);
  bool parsed = SaxParse(json, &sax, [&] { return fresh(false); });
  if (!parsed || !sax.error.ok() || sax.RepeatsKey()) {
    sax = fresh(true);  // read again: the first error, where the reference meets it
    parsed = SaxParse(json, &sax, [&] { return fresh(true); });
  }
  if (!sax.error.ok()) return sax.error;
  if (!parsed) {
    return Fail(SafetensorsError::kInvalidHeaderDeserialization, path, "invalid JSON");
  }
  SafetensorsHeader header;
  LOADSTONE_RETURN_IF_ERROR(Validate(sax, json.size(), file_size, path, &header));
  return header;
}

}  // namespace loadstone::io
