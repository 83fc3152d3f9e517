// The safetensors header's JSON read straight into tensors: a SAX handler (nlohmann's interface,
// fed by io/formats/json_scan.h) that enforces the reference's serde schema. Internal to
// io/formats/safetensors.cc.
#ifndef LOADSTONE_IO_FORMATS_SAFETENSORS_SAX_H_
#define LOADSTONE_IO_FORMATS_SAFETENSORS_SAX_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/limits.h"
#include "io/name_index.h"
#include "io/formats/safetensors.h"

namespace loadstone::io::safetensors_sax {

inline Status Fail(SafetensorsError error, std::string_view path, std::string_view detail) {
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
  static constexpr std::string_view kMetadataKey = "__metadata__";
  using json = nlohmann::json;
  // `keys_checked`: each top-level key is checked against those before it as it is read, so
  // that a repeat is refused where the reference meets it; without, RepeatsKey() tells after
  // the parse (one hash of each name, not two), and the caller reads such a header again.
  HeaderSax(std::string_view path, bool keys_checked) : path_(path), keys_checked_(keys_checked) {}

  std::vector<TensorInfo> tensors;
  std::vector<std::array<uint64_t, 2>> offsets;  // parallel to tensors (relative)
  std::map<std::string, std::string> metadata;
  Status error;

  // Whether a top-level key (a tensor's name, or "__metadata__") appeared twice.
  bool RepeatsKey() const {
    if (metadata_keys_ > 1) return true;
    NameIndex names;
    return names.Build(tensors.size(), [this](size_t i) -> std::string_view {
             return tensors[i].name;
           }) != NameIndex::kNone;
  }

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
        if (std::string_view(key_) == kMetadataKey) {
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
    if (state_ == State::kTop && std::string_view(key_) != kMetadataKey) {
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
      if (std::string_view(k) != kMetadataKey) {
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
      if (keys_checked_ && !top_keys_.insert(k).second) return Duplicate(k);
      if (std::string_view(k) == kMetadataKey) ++metadata_keys_;
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
    const std::string_view field = k;
    field_ = field == "dtype" ? Field::kDtype
             : field == "shape" ? Field::kShape
             : field == "data_offsets" ? Field::kOffsets
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
    TensorInfo& t = tensors.emplace_back();
    t.name = key_;
    t.shape.reserve(4);  // one allocation for the usual ranks
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
    if (state_ == State::kTop && std::string_view(key_) == kMetadataKey && kind == Kind::kNull) return true;
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
  bool keys_checked_;
  int metadata_keys_ = 0;
  std::unordered_set<std::string> top_keys_;  // with keys_checked_
};

}  // namespace loadstone::io::safetensors_sax

#endif  // LOADSTONE_IO_FORMATS_SAFETENSORS_SAX_H_
