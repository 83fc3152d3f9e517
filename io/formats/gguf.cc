#include "io/formats/gguf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <set>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/limits.h"
#include "io/formats/utf8.h"

namespace loadstone::io {
namespace {

// ggml's types (ggml.h, enum ggml_type) with ggml's block sizes; the gaps are removed types.
// Q8_1 is ggml's 36-byte block (the gguf package says 40, a layout ggml no longer has; no file
// holds Q8_1, it is an intermediate of ggml's matmuls).
constexpr std::array<GgmlType, 32> kTypes = {{
    {0, "F32", 1, 4, DType::kF32},   {1, "F16", 1, 2, DType::kF16},
    {2, "Q4_0", 32, 18, {}},         {3, "Q4_1", 32, 20, {}},
    {6, "Q5_0", 32, 22, {}},         {7, "Q5_1", 32, 24, {}},
    {8, "Q8_0", 32, 34, {}},         {9, "Q8_1", 32, 36, {}},
    {10, "Q2_K", 256, 84, {}},       {11, "Q3_K", 256, 110, {}},
    {12, "Q4_K", 256, 144, {}},      {13, "Q5_K", 256, 176, {}},
    {14, "Q6_K", 256, 210, {}},      {15, "Q8_K", 256, 292, {}},
    {16, "IQ2_XXS", 256, 66, {}},    {17, "IQ2_XS", 256, 74, {}},
    {18, "IQ3_XXS", 256, 98, {}},    {19, "IQ1_S", 256, 50, {}},
    {20, "IQ4_NL", 32, 18, {}},      {21, "IQ3_S", 256, 110, {}},
    {22, "IQ2_S", 256, 82, {}},      {23, "IQ4_XS", 256, 136, {}},
    {24, "I8", 1, 1, DType::kI8},    {25, "I16", 1, 2, DType::kI16},
    {26, "I32", 1, 4, DType::kI32},  {27, "I64", 1, 8, DType::kI64},
    {28, "F64", 1, 8, DType::kF64},  {29, "IQ1_M", 256, 56, {}},
    {30, "BF16", 1, 2, DType::kBF16}, {34, "TQ1_0", 256, 54, {}},
    {35, "TQ2_0", 256, 66, {}},      {39, "MXFP4", 32, 17, {}},
}};

enum class ValueType : uint32_t {
  kU8, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64,
};
constexpr uint32_t kValueTypes = 13;
constexpr std::array<std::string_view, kValueTypes> kValueTypeNames = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
constexpr std::array<uint64_t, kValueTypes> kValueBytes = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

// Reads the header through a window of the file; every length is checked against what the file
// still holds before anything is allocated for it.
class Cursor {
 public:
  explicit Cursor(const File& file) : file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return file_.size() - pos_; }

  Status Fail(std::string_view what) const { return Fail(what, pos_); }
  // Past one of loadstone's bounds (io/formats/limits.h), at byte `at`.
  Status Beyond(std::string_view what, std::string_view bound, uint64_t value, uint64_t at) const {
    return BeyondBound(fmt::format("GGUF '{}' at byte {}", file_.path(), at), what, bound, value);
  }
  Status Fail(std::string_view what, uint64_t at) const {
    return Status::Corruption(
        fmt::format("GGUF '{}': {} (byte {})", file_.path(), what, at));
  }

  Status Bytes(void* out, uint64_t n) {
    if (n > left()) return Fail(fmt::format("the header ends inside a {}-byte field (truncated)", n));
    auto* dst = static_cast<std::byte*>(out);
    while (n > 0) {
      if (pos_ < window_at_ || pos_ >= window_at_ + window_.size()) {
        window_at_ = pos_;
        window_.resize(std::min<uint64_t>(kWindow, left()));
        LOADSTONE_RETURN_IF_ERROR(file_.ReadExact(window_at_, window_));
      }
      const uint64_t in = std::min<uint64_t>(n, window_at_ + window_.size() - pos_);
      std::memcpy(dst, window_.data() + (pos_ - window_at_), in);
      dst += in;
      pos_ += in;
      n -= in;
    }
    return Status::OK();
  }
  template <typename T>
  Result<T> Get() {
    T v{};
    LOADSTONE_RETURN_IF_ERROR(Bytes(&v, sizeof(T)));
    return v;  // little-endian host
  }
  Status Skip(uint64_t n) {
    if (n > left()) return Fail("the header ends inside a value (truncated)");
    pos_ += n;
    return Status::OK();
  }
  // A string of at most `max` bytes (else refused before anything is allocated for it):
  // kGgufMaxString unless the format says less.
  Result<std::string> String(std::string_view what, uint64_t max = kGgufMaxString) {
    LOADSTONE_ASSIGN_OR_RETURN(const uint64_t n, StringLength(what, max));
    std::string s(n, '\0');
    LOADSTONE_RETURN_IF_ERROR(Bytes(s.data(), n));
    return s;
  }
  // A string passed over, never held (array elements beyond those shown).
  Status SkipString(std::string_view what) {
    LOADSTONE_ASSIGN_OR_RETURN(const uint64_t n, StringLength(what, kGgufMaxString));
    return Skip(n);
  }

 private:
  Result<uint64_t> StringLength(std::string_view what, uint64_t max) {
    const uint64_t at = pos_;
    LOADSTONE_ASSIGN_OR_RETURN(uint64_t n, Get<uint64_t>());
    if (n > left()) {
      return Fail(fmt::format("{} of {} bytes: more than the file holds", what, n), at);
    }
    if (n > max && max == kGgufMaxString) {
      return Beyond(fmt::format("{} of {} bytes", what, n), "kGgufMaxString", kGgufMaxString, at);
    }
    if (n > max) {
      return Fail(fmt::format("{} of {} bytes: more than the {} allowed", what, n, max), at);
    }
    return n;
  }

  static constexpr uint64_t kWindow = 1 << 20;
  const File& file_;
  uint64_t pos_ = 0;
  uint64_t window_at_ = 0;
  std::vector<std::byte> window_;
};

template <typename T>
std::string Number(Cursor& c, Status* status) {
  auto v = c.Get<T>();
  if (!v.ok()) {
    *status = v.status();
    return "";
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return fmt::format("{}", *v);
  } else {
    return fmt::format("{}", static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(*v));
  }
}

// One scalar of type `type` as text.
Result<std::string> Scalar(Cursor& c, ValueType type) {
  Status s;
  std::string out;
  switch (type) {
    case ValueType::kU8: out = Number<uint8_t>(c, &s); break;
    case ValueType::kI8: out = Number<int8_t>(c, &s); break;
    case ValueType::kU16: out = Number<uint16_t>(c, &s); break;
    case ValueType::kI16: out = Number<int16_t>(c, &s); break;
    case ValueType::kU32: out = Number<uint32_t>(c, &s); break;
    case ValueType::kI32: out = Number<int32_t>(c, &s); break;
    case ValueType::kF32: out = Number<float>(c, &s); break;
    case ValueType::kU64: out = Number<uint64_t>(c, &s); break;
    case ValueType::kI64: out = Number<int64_t>(c, &s); break;
    case ValueType::kF64: out = Number<double>(c, &s); break;
    case ValueType::kBool: {
      const uint64_t at = c.pos();
      LOADSTONE_ASSIGN_OR_RETURN(uint8_t b, c.Get<uint8_t>());
      if (b > 1) return c.Fail(fmt::format("a bool of value {}", b), at);
      out = b ? "true" : "false";
      break;
    }
    case ValueType::kString: return c.String("a string");
    case ValueType::kArray: return c.Fail("an array where a scalar belongs");
  }
  if (!s.ok()) return s;
  return out;
}

Result<ValueType> TypeOf(Cursor& c, std::string_view key) {
  const uint64_t at = c.pos();
  LOADSTONE_ASSIGN_OR_RETURN(uint32_t t, c.Get<uint32_t>());
  if (t >= kValueTypes) return c.Fail(fmt::format("key '{}' has value type {} (≥ 13)", key, t), at);
  return static_cast<ValueType>(t);
}

// An array's elements as text: JSON of the first kGgufArrayShown, or "[N x TYPE]".
Result<std::string> Array(Cursor& c, std::string_view key, int depth) {
  LOADSTONE_ASSIGN_OR_RETURN(ValueType type, TypeOf(c, key));
  const uint64_t at = c.pos();
  LOADSTONE_ASSIGN_OR_RETURN(uint64_t count, c.Get<uint64_t>());
  const auto t = static_cast<uint32_t>(type);
  // Every element takes at least this much: a string its u64 length, an array its type and count.
  const uint64_t least = type == ValueType::kString ? 8 : type == ValueType::kArray ? 12 : kValueBytes[t];
  if (count > c.left() / least) {
    return c.Fail(fmt::format("key '{}': an array of {} {} elements does not fit the {} bytes "
                              "left", key, count, kValueTypeNames[t], c.left()), at);
  }
  if (count > kGgufMaxArray) {
    return c.Beyond(fmt::format("key '{}': an array of {} elements", key, count), "kGgufMaxArray",
                    kGgufMaxArray, at);
  }
  if (type == ValueType::kArray && depth >= 1) {
    return c.Fail(fmt::format("key '{}': arrays nested more than one level", key), at);
  }
  nlohmann::json shown = nlohmann::json::array();
  uint64_t shown_bytes = 0;
  for (uint64_t i = 0; i < count; ++i) {
    std::string text;
    if (type == ValueType::kArray) {
      LOADSTONE_ASSIGN_OR_RETURN(text, Array(c, key, depth + 1));
    } else if (type != ValueType::kString && i >= kGgufArrayShown) {
      LOADSTONE_RETURN_IF_ERROR(c.Skip((count - i) * kValueBytes[t]));
      break;
    } else if (i >= kGgufArrayShown) {
      LOADSTONE_RETURN_IF_ERROR(c.SkipString("a string"));
      continue;
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(text, Scalar(c, type));
    }
    if (i >= kGgufArrayShown) continue;
    shown_bytes += text.size();
    if (shown_bytes > kGgufMaxMetadataBytes) {
      return c.Beyond(fmt::format("key '{}': array elements of {} bytes", key, shown_bytes),
                      "kGgufMaxMetadataBytes", kGgufMaxMetadataBytes, at);
    }
    nlohmann::json parsed = type == ValueType::kString ? nlohmann::json(nullptr)
                                                       : nlohmann::json::parse(text, nullptr, false);
    if (type == ValueType::kString || parsed.is_discarded()) {
      shown.push_back(text);  // a string, a summary "[N x T]", a nan or inf
    } else {
      shown.push_back(std::move(parsed));
    }
  }
  if (count > kGgufArrayShown) return fmt::format("[{} x {}]", count, kValueTypeNames[t]);
  return shown.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

__extension__ using u128 = unsigned __int128;

}  // namespace

const GgmlType* GgmlTypeById(uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

Result<GgufFile> ReadGgufHeader(const File& file) {
  Cursor c(file);
  GgufFile out;
  std::array<char, 4> magic{};
  LOADSTONE_RETURN_IF_ERROR(c.Bytes(magic.data(), magic.size()));
  if (std::string_view(magic.data(), 4) != "GGUF") return c.Fail("bad magic: not \"GGUF\"", 0);
  LOADSTONE_ASSIGN_OR_RETURN(out.version, c.Get<uint32_t>());
  if ((out.version & 0xFFFF) == 0) {
    return c.Fail(fmt::format("version 0x{:08x}: a file of the other byte order (big-endian GGUF)",
                              out.version), 4);
  }
  if (out.version < 2 || out.version > 3) {
    return c.Fail(fmt::format("version {}: loadstone reads GGUF versions 2 and 3", out.version), 4);
  }
  LOADSTONE_ASSIGN_OR_RETURN(int64_t n_tensors, c.Get<int64_t>());
  LOADSTONE_ASSIGN_OR_RETURN(int64_t n_kv, c.Get<int64_t>());
  // A tensor info takes at least 24 bytes (name length, n_dims, type, offset), a key-value 13.
  if (n_tensors < 0 || static_cast<uint64_t>(n_tensors) > c.left() / 24) {
    return c.Fail(fmt::format("{} tensors cannot fit a file of {} bytes", n_tensors, file.size()), 8);
  }
  if (n_kv < 0 || static_cast<uint64_t>(n_kv) > c.left() / 13) {
    return c.Fail(fmt::format("{} key-values cannot fit a file of {} bytes", n_kv, file.size()), 16);
  }
  if (static_cast<uint64_t>(n_tensors) > kMaxTensorsPerFile) {
    return c.Beyond(fmt::format("{} tensors", n_tensors), "kMaxTensorsPerFile", kMaxTensorsPerFile,
                    8);
  }
  if (static_cast<uint64_t>(n_kv) > kGgufMaxKeys) {
    return c.Beyond(fmt::format("{} key-values", n_kv), "kGgufMaxKeys", kGgufMaxKeys, 16);
  }
  uint64_t metadata_bytes = 0;  // kept: keys and values as text

  std::unordered_set<std::string> keys;
  for (int64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    LOADSTONE_ASSIGN_OR_RETURN(std::string key, c.String("a key", kGgufMaxKey));
    if (key.empty()) return c.Fail(fmt::format("key-value {} has an empty key", k), at);
    if (!keys.insert(key).second) return c.Fail(fmt::format("key '{}' appears twice", key), at);
    LOADSTONE_ASSIGN_OR_RETURN(ValueType type, TypeOf(c, key));
    std::string value;
    if (key == "general.alignment") {
      if (type != ValueType::kU32) {
        return c.Fail(fmt::format("general.alignment is a {}, not a u32",
                                  kValueTypeNames[static_cast<uint32_t>(type)]), at);
      }
      LOADSTONE_ASSIGN_OR_RETURN(out.alignment, c.Get<uint32_t>());
      if (out.alignment == 0 || !std::has_single_bit(out.alignment)) {
        return c.Fail(fmt::format("general.alignment = {} is not a non-zero power of two",
                                  out.alignment), at);
      }
      value = fmt::format("{}", out.alignment);
    } else if (type == ValueType::kArray) {
      LOADSTONE_ASSIGN_OR_RETURN(value, Array(c, key, 0));
    } else {
      LOADSTONE_ASSIGN_OR_RETURN(value, Scalar(c, type));
    }
    metadata_bytes += key.size() + value.size();
    if (metadata_bytes > kGgufMaxMetadataBytes) {
      return c.Beyond(fmt::format("metadata of {} bytes up to key '{}'", metadata_bytes, key),
                      "kGgufMaxMetadataBytes", kGgufMaxMetadataBytes, at);
    }
    out.metadata.emplace_back(std::move(key), std::move(value));
  }

  struct Info {
    uint64_t at;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Info> infos;
  // Reserved up to a bound only: the count is the file's word.
  infos.reserve(std::min<size_t>(static_cast<size_t>(n_tensors), 1 << 16));
  std::unordered_set<std::string> names;
  out.tensors.reserve(std::min<size_t>(static_cast<size_t>(n_tensors), 1 << 16));
  for (int64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    // ggml's names are shorter than GGML_MAX_NAME (64): refused before the name is read.
    LOADSTONE_ASSIGN_OR_RETURN(std::string name, c.String("a tensor name", kGgufMaxName - 1));
    if (FindInvalidUtf8(name) != std::string::npos) {
      return c.Fail(fmt::format("tensor name '{}' is not UTF-8", name), at);
    }
    if (!names.insert(name).second) return c.Fail(fmt::format("tensor '{}' appears twice", name), at);
    LOADSTONE_ASSIGN_OR_RETURN(uint32_t n_dims, c.Get<uint32_t>());
    if (n_dims > kGgufMaxDims) {
      return c.Fail(fmt::format("tensor '{}' has {} dimensions, ggml allows at most {}", name,
                                n_dims, kGgufMaxDims), at);
    }
    std::vector<uint64_t> ne(n_dims);
    u128 numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      LOADSTONE_ASSIGN_OR_RETURN(int64_t v, c.Get<int64_t>());
      if (v < 0) return c.Fail(fmt::format("tensor '{}' ne[{}] = {} is negative", name, d, v), at);
      ne[d] = static_cast<uint64_t>(v);
      numel *= ne[d];
      if (numel > static_cast<u128>(INT64_MAX)) {
        return c.Fail(fmt::format("tensor '{}' has more elements than fit 63 bits", name), at);
      }
    }
    LOADSTONE_ASSIGN_OR_RETURN(uint32_t type_id, c.Get<uint32_t>());
    const GgmlType* type = GgmlTypeById(type_id);
    if (!type) return c.Fail(fmt::format("tensor '{}' has ggml type {}, which names no type", name, type_id), at);
    const uint64_t ne0 = n_dims ? ne[0] : 1;
    if (ne0 % type->block_elems != 0) {
      return c.Fail(fmt::format("tensor '{}' ne[0] = {} is not a multiple of the {} block ({})",
                                name, ne0, type->name, type->block_elems), at);
    }
    const u128 bytes = numel / type->block_elems * type->block_bytes;
    if (bytes > static_cast<u128>(INT64_MAX)) {
      return c.Fail(fmt::format("tensor '{}' takes more bytes than fit 63 bits", name), at);
    }
    LOADSTONE_ASSIGN_OR_RETURN(uint64_t offset, c.Get<uint64_t>());
    infos.push_back({at, offset, static_cast<uint64_t>(bytes)});

    TensorInfo t;
    t.name = std::move(name);
    std::vector<uint64_t> shape(ne.rbegin(), ne.rend());  // ggml is fastest-first
    if (type->dtype) {
      t.dtype = *type->dtype;
      t.shape = std::move(shape);
    } else {
      t.dtype = DType::kU8;
      t.shape = shape;
      if (!t.shape.empty()) t.shape.back() = ne0 / type->block_elems * type->block_bytes;
      t.packed = PackedLayout{std::string(type->name), std::move(shape), type->block_elems,
                              type->block_bytes};
    }
    t.nbytes = static_cast<uint64_t>(bytes);
    out.tensors.push_back(std::move(t));
  }
  const uint64_t a = out.alignment;
  if (c.pos() > UINT64_MAX - a) return c.Fail("the header ends past 2^64");
  out.data_start = (c.pos() + a - 1) / a * a;
  uint64_t expected = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    TensorInfo& t = out.tensors[i];
    if (infos[i].offset != expected) {
      return c.Fail(fmt::format("tensor '{}' is at data offset {}, where the tensors before it "
                                "(padded to {}) end at {}", t.name, infos[i].offset, a, expected),
                    infos[i].at);
    }
    const u128 end = static_cast<u128>(out.data_start) + infos[i].offset + infos[i].bytes;
    if (end > file.size()) {
      return c.Fail(fmt::format("tensor '{}' ({} bytes at {}) runs past the end of the file ({} "
                                "bytes)", t.name, infos[i].bytes, out.data_start + infos[i].offset,
                                file.size()), infos[i].at);
    }
    t.offset = out.data_start + infos[i].offset;
    const u128 next = (static_cast<u128>(infos[i].offset) + infos[i].bytes + a - 1) / a * a;
    expected = static_cast<uint64_t>(std::min<u128>(next, UINT64_MAX));
  }
  return out;
}

}  // namespace loadstone::io
