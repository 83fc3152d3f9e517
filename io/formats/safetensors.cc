#include "io/formats/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/limits.h"
#include "io/formats/utf8.h"

namespace loadstone::io {
namespace {

Status Fail(SafetensorsError error, std::string_view path, std::string_view detail) {
  return SafetensorsCorruption(error, path, detail);
}

// Builds the tensor table straight from SAX events, enforcing the reference's serde schema:
//   {"__metadata__": null | {str: str},
//    name: {"dtype": D, "shape": [u64], "data_offsets": [u64, u64], other fields ignored}
//        | [D, [u64], [u64, u64]]}                        (serde also takes a struct as a sequence)
//   D = "F32" | {"F32": null}                              (serde's two forms of a unit variant)
// and rejecting duplicate keys at every level that has a schema.
class HeaderSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  using json = nlohmann::json;
  explicit HeaderSax(std::string_view path) : path_(path) {}

  std::vector<TensorInfo> tensors;
  std::vector<std::array<uint64_t, 2>> offsets;  // parallel to tensors (relative)
  std::map<std::string, std::string> metadata;
  Status error;

  bool null() override {
    if (skip_ > 0) return true;
    if (state_ == State::kDtypeMap && dtype_map_value_pending_) {
      dtype_map_value_pending_ = false;
      return true;
    }
    return Scalar(Kind::kNull);
  }
  bool boolean(bool) override { return Scalar(Kind::kOther); }
  bool number_integer(number_integer_t) override { return Scalar(Kind::kOther); }  // < 0, -0
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ > 0) return true;
    if (state_ == State::kShape) {
      if (tensors.back().shape.size() >= kMaxTensorRank) {
        return Bound(fmt::format("tensor '{}': a shape of more than {} dimensions",
                                 tensors.back().name, kMaxTensorRank),
                     "kMaxTensorRank", kMaxTensorRank);
      }
      tensors.back().shape.push_back(v);
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offset_count_ >= 2) return Schema("invalid length, data_offsets expects 2 elements");
      offsets.back()[offset_count_++] = v;
      return true;
    }
    return Scalar(Kind::kOther);
  }
  bool number_float(number_float_t, const string_t&) override { return Scalar(Kind::kOther); }
  bool binary(binary_t&) override { return Scalar(Kind::kOther); }

  bool string(string_t& s) override {
    if (skip_ > 0) return true;
    if (state_ == State::kMetadata) {
      metadata.emplace(key_, s);
      return true;
    }
    if (!NextSeqField()) return false;
    if (InTensor() && field_ == Field::kDtype) return SetDtype(s);
    return Scalar(Kind::kOther);
  }

  // kSafetensorsMaxDepth is serde_json's recursion limit, as the reference hits it: 127 nested
  // arrays/objects pass.
  bool start_object(std::size_t) override {
    if (++depth_ > kSafetensorsMaxDepth) return Schema("recursion limit exceeded");
    if (skip_ > 0) return ++skip_, true;
    if (!NextSeqField()) return false;
    switch (state_) {
      case State::kStart: state_ = State::kTop; return true;
      case State::kTop:
        if (key_ == "__metadata__") {
          state_ = State::kMetadata;
          return true;
        }
        BeginTensor(State::kTensor);
        return true;
      case State::kTensor:
      case State::kTensorSeq:
        if (field_ == Field::kOther) return ++skip_, true;
        if (field_ == Field::kDtype) {
          state_ = State::kDtypeMap;
          dtype_map_keys_ = 0;
          return true;
        }
        return Schema(fmt::format("invalid type: map for field '{}'", FieldName()));
      default: return Schema("invalid type: map, expected a string or an integer");
    }
  }

  bool end_object() override {
    --depth_;
    if (skip_ > 0) return --skip_, true;
    switch (state_) {
      case State::kMetadata: state_ = State::kTop; return true;
      case State::kDtypeMap:
        if (dtype_map_keys_ != 1 || dtype_map_value_pending_) {
          return Schema("dtype: expected a single-key map {\"DTYPE\": null}");
        }
        state_ = tensor_state_;
        return true;
      case State::kTensor:
        for (int f = 0; f < 3; ++f) {
          if (!seen_[f]) {
            field_ = static_cast<Field>(f);
            return Schema(fmt::format("missing field '{}'", FieldName()));
          }
        }
        state_ = State::kTop;
        return true;
      default: state_ = State::kDone; return true;
    }
  }

  bool start_array(std::size_t) override {
    if (++depth_ > kSafetensorsMaxDepth) return Schema("recursion limit exceeded");
    if (skip_ > 0) return ++skip_, true;
    if (!NextSeqField()) return false;
    if (state_ == State::kTop && key_ != "__metadata__") {
      BeginTensor(State::kTensorSeq);
      return true;
    }
    if (InTensor()) {
      switch (field_) {
        case Field::kShape: state_ = State::kShape; return true;
        case Field::kOffsets: state_ = State::kOffsets; offset_count_ = 0; return true;
        case Field::kOther: return ++skip_, true;
        case Field::kDtype: break;
      }
    }
    return Schema(state_ == State::kStart ? "invalid type: sequence, expected a map"
                                          : "invalid type: sequence");
  }

  bool end_array() override {
    --depth_;
    if (skip_ > 0) return --skip_, true;
    if (state_ == State::kTensorSeq) {
      if (seq_pos_ != 3) return Schema("invalid length, expected a sequence of 3 elements");
      state_ = State::kTop;
      return true;
    }
    if (state_ == State::kOffsets && offset_count_ != 2) {
      return Schema("invalid length, data_offsets expects 2 elements");
    }
    state_ = tensor_state_;
    return true;
  }

  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    if (state_ == State::kTop) {
      if (k != "__metadata__") {
        if (k.size() > kMaxTensorNameBytes) {
          return Bound(
              fmt::format("a tensor name of {} bytes ('{}...')", k.size(), k.substr(0, 40)),
              "kMaxTensorNameBytes", kMaxTensorNameBytes);
        }
        if (tensors.size() >= kMaxTensorsPerFile) {
          return Bound(fmt::format("tensor '{}', the {}th", k, tensors.size() + 1),
                       "kMaxTensorsPerFile", kMaxTensorsPerFile);
        }
      }
      if (!top_keys_.insert(k).second) return Duplicate(k);
      key_ = k;
      return true;
    }
    if (state_ == State::kMetadata) {
      if (metadata.count(k)) return Duplicate(fmt::format("__metadata__.{}", k));
      key_ = k;
      return true;
    }
    if (state_ == State::kDtypeMap) {
      if (++dtype_map_keys_ > 1) return Schema("dtype: expected a single-key map");
      dtype_map_value_pending_ = true;
      return SetDtype(k);
    }
    // kTensor
    field_ = k == "dtype" ? Field::kDtype
             : k == "shape" ? Field::kShape
             : k == "data_offsets" ? Field::kOffsets
                                   : Field::kOther;
    if (field_ != Field::kOther) {
      auto& seen = seen_[static_cast<int>(field_)];
      if (seen) return Schema(fmt::format("duplicate field '{}'", k));
      seen = true;
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (error.ok()) {
      error = Fail(SafetensorsError::kInvalidHeaderDeserialization, path_,
                   fmt::format("invalid JSON at header byte {}: {}", position, ex.what()));
    }
    return false;
  }

 private:
  enum class State { kStart, kTop, kMetadata, kTensor, kTensorSeq, kDtypeMap, kShape, kOffsets, kDone };
  enum class Field { kDtype = 0, kShape = 1, kOffsets = 2, kOther = 3 };
  enum class Kind { kNull, kOther };

  bool InTensor() const { return state_ == State::kTensor || state_ == State::kTensorSeq; }

  void BeginTensor(State form) {
    state_ = tensor_state_ = form;
    tensors.emplace_back().name = key_;
    offsets.push_back({0, 0});
    seen_ = {};
    seq_pos_ = 0;
    field_ = Field::kOther;
  }

  // In the sequence form, each value takes the next field: dtype, shape, data_offsets.
  bool NextSeqField() {
    if (state_ != State::kTensorSeq) return true;
    if (seq_pos_ >= 3) return Schema("invalid length, expected a sequence of 3 elements");
    field_ = static_cast<Field>(seq_pos_++);
    return true;
  }

  bool SetDtype(std::string_view name) {
    auto dtype = DTypeFromSafetensorsName(name);
    if (!dtype) return Schema(fmt::format("unknown dtype '{}'", name));
    tensors.back().dtype = *dtype;
    return true;
  }

  std::string_view FieldName() const {
    static constexpr std::string_view kNames[] = {"dtype", "shape", "data_offsets", "?"};
    return kNames[static_cast<int>(field_)];
  }

  bool Scalar(Kind kind) {
    if (skip_ > 0) return true;
    if (!NextSeqField()) return false;
    if (state_ == State::kTop && key_ == "__metadata__" && kind == Kind::kNull) return true;
    if (state_ == State::kTensor && field_ == Field::kOther) return true;
    if (state_ == State::kStart) return Schema("invalid type, expected a map");
    return Schema("invalid type (expected a string, an unsigned integer or an object)");
  }

  bool Schema(std::string detail) {
    if (error.ok()) {
      const bool in_tensor = state_ == State::kTensor || state_ == State::kTensorSeq ||
                             state_ == State::kDtypeMap || state_ == State::kShape ||
                             state_ == State::kOffsets;
      std::string where =
          in_tensor ? fmt::format("tensor '{}': ", tensors.back().name) : std::string();
      error = Fail(SafetensorsError::kInvalidHeaderDeserialization, path_, where + detail);
    }
    return false;
  }

  bool Bound(std::string what, std::string_view bound, uint64_t value) {
    if (error.ok()) {
      error = BeyondBound(fmt::format("safetensors header of '{}'", path_), what, bound, value);
    }
    return false;
  }

  bool Duplicate(std::string_view key) {
    error = Fail(SafetensorsError::kDuplicateKey, path_,
                 fmt::format("key '{}' appears twice in the header (the reference implementation "
                             "would silently keep the last one; loadstone refuses the file)",
                             key));
    return false;
  }

  std::string_view path_;
  State state_ = State::kStart;
  State tensor_state_ = State::kTensor;  // the form of the tensor being read
  Field field_ = Field::kOther;
  std::array<bool, 3> seen_{};
  int seq_pos_ = 0;
  int offset_count_ = 0;
  int dtype_map_keys_ = 0;
  bool dtype_map_value_pending_ = false;
  int depth_ = 0;
  int skip_ = 0;  // > 0 while inside an ignored value
  std::string key_;
  std::unordered_set<std::string> top_keys_;
};

// Checks offsets, sizes and coverage in the reference's order; fills offset and nbytes.
Status Validate(HeaderSax& sax, uint64_t header_len, uint64_t file_size, std::string_view path,
                SafetensorsHeader* out) {
  const uint64_t data_start = 8 + header_len;
  std::vector<size_t> order(sax.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (sax.offsets[a] != sax.offsets[b]) return sax.offsets[a] < sax.offsets[b];
    return sax.tensors[a].name < sax.tensors[b].name;
  });
  uint64_t end_so_far = 0;
  out->tensors.reserve(order.size());
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
    t.offset = data_start + begin;
    t.nbytes = end - begin;
    out->tensors.push_back(std::move(t));
  }
  uint64_t covered;
  if (__builtin_add_overflow(end_so_far, data_start, &covered) || covered != file_size) {
    return Fail(SafetensorsError::kMetadataIncompleteBuffer, path,
                fmt::format("header + tensors cover {} + {} bytes, the file has {} (truncated "
                            "file, or bytes after the last tensor)",
                            data_start, end_so_far, file_size));
  }
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
  HeaderSax sax(path);
  bool parsed = nlohmann::json::sax_parse(json.begin(), json.end(), &sax,
                                          nlohmann::json::input_format_t::json, true);
  if (!sax.error.ok()) return sax.error;
  if (!parsed) {
    return Fail(SafetensorsError::kInvalidHeaderDeserialization, path, "invalid JSON");
  }
  SafetensorsHeader header;
  LOADSTONE_RETURN_IF_ERROR(Validate(sax, json.size(), file_size, path, &header));
  return header;
}

}  // namespace loadstone::io
