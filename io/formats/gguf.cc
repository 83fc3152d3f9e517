#include "io/formats/gguf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <set>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/gguf_cursor.h"
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

template <typename T>
std::string Number(GgufCursor& c, Status* status) {
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
Result<std::string> Scalar(GgufCursor& c, ValueType type) {
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

Result<ValueType> TypeOf(GgufCursor& c, std::string_view key) {
  const uint64_t at = c.pos();
  LOADSTONE_ASSIGN_OR_RETURN(uint32_t t, c.Get<uint32_t>());
  if (t >= kValueTypes) return c.Fail(fmt::format("key '{}' has value type {} (≥ 13)", key, t), at);
  return static_cast<ValueType>(t);
}

// An array's elements as text: JSON of the first kGgufArrayShown, or "[N x TYPE]".
Result<std::string> Array(GgufCursor& c, std::string_view key, int depth) {
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

struct Counts {
  int64_t tensors = 0;
  int64_t kv = 0;
};

// The magic, the version (2 or 3, in this byte order) and the two counts, each checked against
// the bytes the file holds and loadstone's bounds.
Result<Counts> ReadPreamble(GgufCursor& c, const File& file, uint32_t* version) {
  std::array<char, 4> magic{};
  LOADSTONE_RETURN_IF_ERROR(c.Bytes(magic.data(), magic.size()));
  if (std::string_view(magic.data(), 4) != "GGUF") return c.Fail("bad magic: not \"GGUF\"", 0);
  LOADSTONE_ASSIGN_OR_RETURN(*version, c.Get<uint32_t>());
  if ((*version & 0xFFFF) == 0) {
    return c.Fail(fmt::format("version 0x{:08x}: a file of the other byte order (big-endian GGUF)",
                              *version), 4);
  }
  if (*version < 2 || *version > 3) {
    return c.Fail(fmt::format("version {}: loadstone reads GGUF versions 2 and 3", *version), 4);
  }
  Counts n;
  LOADSTONE_ASSIGN_OR_RETURN(n.tensors, c.Get<int64_t>());
  LOADSTONE_ASSIGN_OR_RETURN(n.kv, c.Get<int64_t>());
  // A tensor info takes at least 24 bytes (name length, n_dims, type, offset), a key-value 13.
  if (n.tensors < 0 || static_cast<uint64_t>(n.tensors) > c.left() / 24) {
    return c.Fail(fmt::format("{} tensors cannot fit a file of {} bytes", n.tensors, file.size()), 8);
  }
  if (n.kv < 0 || static_cast<uint64_t>(n.kv) > c.left() / 13) {
    return c.Fail(fmt::format("{} key-values cannot fit a file of {} bytes", n.kv, file.size()), 16);
  }
  if (static_cast<uint64_t>(n.tensors) > kMaxTensorsPerFile) {
    return c.Beyond(fmt::format("{} tensors", n.tensors), "kMaxTensorsPerFile", kMaxTensorsPerFile,
                    8);
  }
  if (static_cast<uint64_t>(n.kv) > kGgufMaxKeys) {
    return c.Beyond(fmt::format("{} key-values", n.kv), "kGgufMaxKeys", kGgufMaxKeys, 16);
  }
  return n;
}

// The value of general.alignment (key at byte `at`): a u32, a non-zero power of two.
Result<std::string> ReadAlignment(GgufCursor& c, ValueType type, uint64_t at,
                                  uint32_t* alignment) {
  if (type != ValueType::kU32) {
    return c.Fail(fmt::format("general.alignment is a {}, not a u32",
                              kValueTypeNames[static_cast<uint32_t>(type)]), at);
  }
  LOADSTONE_ASSIGN_OR_RETURN(*alignment, c.Get<uint32_t>());
  if (*alignment == 0 || !std::has_single_bit(*alignment)) {
    return c.Fail(fmt::format("general.alignment = {} is not a non-zero power of two",
                              *alignment), at);
  }
  return fmt::format("{}", *alignment);
}

// The `n_kv` key-values into out->metadata (and general.alignment into out->alignment): keys
// non-empty and unique, keys and values at most kGgufMaxMetadataBytes as text in all.
Status ReadMetadata(GgufCursor& c, int64_t n_kv, GgufFile* out) {
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
      LOADSTONE_ASSIGN_OR_RETURN(value, ReadAlignment(c, type, at, &out->alignment));
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
    out->metadata.emplace_back(std::move(key), std::move(value));
  }
  return Status::OK();
}

// A tensor's ne[] (ggml's order, fastest first) and its element count, below 2^63.
struct Dims {
  std::vector<uint64_t> ne;
  u128 numel = 1;
};

// The dimensions of tensor `name` (its info at byte `at`): at most kGgufMaxDims, none negative.
Result<Dims> ReadDims(GgufCursor& c, const std::string& name, uint64_t at) {
  LOADSTONE_ASSIGN_OR_RETURN(uint32_t n_dims, c.Get<uint32_t>());
  if (n_dims > kGgufMaxDims) {
    return c.Fail(fmt::format("tensor '{}' has {} dimensions, ggml allows at most {}", name,
                              n_dims, kGgufMaxDims), at);
  }
  Dims dims;
  dims.ne.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    LOADSTONE_ASSIGN_OR_RETURN(int64_t v, c.Get<int64_t>());
    if (v < 0) return c.Fail(fmt::format("tensor '{}' ne[{}] = {} is negative", name, d, v), at);
    dims.ne[d] = static_cast<uint64_t>(v);
    dims.numel *= dims.ne[d];
    if (dims.numel > static_cast<u128>(INT64_MAX)) {
      return c.Fail(fmt::format("tensor '{}' has more elements than fit 63 bits", name), at);
    }
  }
  return dims;
}

// The catalog entry of a tensor of `type` whose data takes `bytes`: its DType, or for a
// block-quantized type U8 rows of whole blocks with the element shape in `packed`.
TensorInfo CatalogEntry(std::string name, const std::vector<uint64_t>& ne, const GgmlType& type,
                        uint64_t bytes) {
  TensorInfo t;
  t.name = std::move(name);
  std::vector<uint64_t> shape(ne.rbegin(), ne.rend());  // ggml is fastest-first
  if (type.dtype) {
    t.dtype = *type.dtype;
    t.shape = std::move(shape);
  } else {
    const uint64_t ne0 = ne.empty() ? 1 : ne[0];
    t.dtype = DType::kU8;
    t.shape = shape;
    if (!t.shape.empty()) t.shape.back() = ne0 / type.block_elems * type.block_bytes;
    t.packed = PackedLayout{std::string(type.name), std::move(shape), type.block_elems,
                            type.block_bytes};
  }
  t.nbytes = bytes;
  return t;
}

// Where a tensor info was, and where the file says its data is (in the data section).
struct Info {
  uint64_t at;
  uint64_t offset;
  uint64_t bytes;
};

// One tensor info into `t`: a name of at most kGgufMaxName - 1 bytes, UTF-8 and not in
// `names`; its dimensions; a ggml type whose blocks tile ne[0]; below 2^63 bytes.
Result<Info> ReadTensorInfo(GgufCursor& c, std::unordered_set<std::string>* names,
                            TensorInfo* t) {
  const uint64_t at = c.pos();
  // ggml's names are shorter than GGML_MAX_NAME (64): refused before the name is read.
  LOADSTONE_ASSIGN_OR_RETURN(std::string name, c.String("a tensor name", kGgufMaxName - 1));
  if (FindInvalidUtf8(name) != std::string::npos) {
    return c.Fail(fmt::format("tensor name '{}' is not UTF-8", name), at);
  }
  if (!names->insert(name).second) return c.Fail(fmt::format("tensor '{}' appears twice", name), at);
  LOADSTONE_ASSIGN_OR_RETURN(const Dims dims, ReadDims(c, name, at));
  LOADSTONE_ASSIGN_OR_RETURN(uint32_t type_id, c.Get<uint32_t>());
  const GgmlType* type = GgmlTypeById(type_id);
  if (!type) return c.Fail(fmt::format("tensor '{}' has ggml type {}, which names no type", name, type_id), at);
  const uint64_t ne0 = dims.ne.empty() ? 1 : dims.ne[0];
  if (ne0 % type->block_elems != 0) {
    return c.Fail(fmt::format("tensor '{}' ne[0] = {} is not a multiple of the {} block ({})",
                              name, ne0, type->name, type->block_elems), at);
  }
  const u128 bytes = dims.numel / type->block_elems * type->block_bytes;
  if (bytes > static_cast<u128>(INT64_MAX)) {
    return c.Fail(fmt::format("tensor '{}' takes more bytes than fit 63 bits", name), at);
  }
  LOADSTONE_ASSIGN_OR_RETURN(uint64_t offset, c.Get<uint64_t>());
  *t = CatalogEntry(std::move(name), dims.ne, *type, static_cast<uint64_t>(bytes));
  return Info{at, offset, static_cast<uint64_t>(bytes)};
}

// Sets out->data_start (the header's end, aligned) and each tensor's offset: each at the data
// offset where the ones before it end (padded to the alignment), and inside the file.
Status PlaceTensors(GgufCursor& c, const File& file, const std::vector<Info>& infos,
                    GgufFile* out) {
  const uint64_t a = out->alignment;
  if (c.pos() > UINT64_MAX - a) return c.Fail("the header ends past 2^64");
  out->data_start = (c.pos() + a - 1) / a * a;
  uint64_t expected = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    TensorInfo& t = out->tensors[i];
    if (infos[i].offset != expected) {
      return c.Fail(fmt::format("tensor '{}' is at data offset {}, where the tensors before it "
                                "(padded to {}) end at {}", t.name, infos[i].offset, a, expected),
                    infos[i].at);
    }
    const u128 end = static_cast<u128>(out->data_start) + infos[i].offset + infos[i].bytes;
    if (end > file.size()) {
      return c.Fail(fmt::format("tensor '{}' ({} bytes at {}) runs past the end of the file ({} "
                                "bytes)", t.name, infos[i].bytes, out->data_start + infos[i].offset,
                                file.size()), infos[i].at);
    }
    t.offset = out->data_start + infos[i].offset;
    const u128 next = (static_cast<u128>(infos[i].offset) + infos[i].bytes + a - 1) / a * a;
    expected = static_cast<uint64_t>(std::min<u128>(next, UINT64_MAX));
  }
  return Status::OK();
}

}  // namespace

const GgmlType* GgmlTypeById(uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

Result<GgufFile> ReadGgufHeader(const File& file) {
  GgufCursor c(file);
  GgufFile out;
  LOADSTONE_ASSIGN_OR_RETURN(const Counts n, ReadPreamble(c, file, &out.version));
  LOADSTONE_RETURN_IF_ERROR(ReadMetadata(c, n.kv, &out));
  std::vector<Info> infos;
  // Reserved up to a bound only: the count is the file's word.
  infos.reserve(std::min<size_t>(static_cast<size_t>(n.tensors), 1 << 16));
  std::unordered_set<std::string> names;
  out.tensors.reserve(std::min<size_t>(static_cast<size_t>(n.tensors), 1 << 16));
  for (int64_t i = 0; i < n.tensors; ++i) {
    TensorInfo t;
    LOADSTONE_ASSIGN_OR_RETURN(const Info info, ReadTensorInfo(c, &names, &t));
    infos.push_back(info);
    out.tensors.push_back(std::move(t));
  }
  LOADSTONE_RETURN_IF_ERROR(PlaceTensors(c, file, infos, &out));
  return out;
}

}  // namespace loadstone::io
