#include "io/formats/bnb_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "io/formats/limits.h"
#include "io/formats/small_reads.h"
#include "io/formats/json_util.h"

namespace loadstone::io {
namespace {

constexpr std::string_view kStateMarker = ".quant_state.bitsandbytes__";

// What the state's JSON says.
struct StateDoc {
  std::string quant_type;
  uint64_t blocksize = 0;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> shape;
  bool nested = false;
  uint64_t nested_blocksize = 0;
  float nested_offset = 0;
};

bool IsBlockSize(uint64_t b) { return b >= 32 && b <= 4096 && std::has_single_bit(b); }

// bitsandbytes writes str(dtype).strip("torch.").
std::optional<DType> StateDType(const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

Result<StateDoc> ParseState(const nlohmann::json& doc, const std::string& what) {
  auto fail = [&](std::string_view why) {
    return Status::Corruption(fmt::format("{}: {}", what, why));
  };
  if (!doc.is_object()) return fail("not a JSON object");
  StateDoc s;
  const auto qt = doc.find("quant_type");
  if (qt == doc.end() || !qt->is_string()) return fail("no quant_type string");
  s.quant_type = qt->get<std::string>();
  const auto bs = doc.find("blocksize");
  if (bs == doc.end() || !bs->is_number_unsigned() || !IsBlockSize(bs->get<uint64_t>())) {
    return fail("blocksize is not a power of two from 32 to 4096");
  }
  s.blocksize = bs->get<uint64_t>();
  const auto dt = doc.find("dtype");
  const auto dtype =
      dt != doc.end() && dt->is_string() ? StateDType(dt->get<std::string>()) : std::nullopt;
  if (!dtype) return fail("dtype is not \"float32\", \"float16\" or \"bfloat16\"");
  s.dtype = *dtype;
  const auto shape = doc.find("shape");
  if (shape == doc.end() || !shape->is_array() || shape->empty() || shape->size() > 8) {
    return fail("shape is not an array of 1 to 8 dimensions");
  }
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() == 0)
      return fail("shape has a dimension that is not a positive integer");
    s.shape.push_back(d.get<uint64_t>());
  }
  const bool any_nested = doc.contains("nested_blocksize") || doc.contains("nested_dtype") ||
                          doc.contains("nested_offset");
  if (!any_nested) return s;
  s.nested = true;
  const auto nbs = doc.find("nested_blocksize");
  const auto ndt = doc.find("nested_dtype");
  const auto off = doc.find("nested_offset");
  if (nbs == doc.end() || !nbs->is_number_unsigned() || !IsBlockSize(nbs->get<uint64_t>())) {
    return fail("nested_blocksize is not a power of two from 32 to 4096");
  }
  if (ndt == doc.end() || !ndt->is_string() || ndt->get<std::string>() != "float32") {
    return fail("nested_dtype is not \"float32\"");
  }
  if (off == doc.end() || !off->is_number() || !std::isfinite(off->get<double>()) ||
      std::fabs(off->get<double>()) > std::numeric_limits<float>::max()) {
    return fail("nested_offset is not a finite float32 number");
  }
  s.nested_blocksize = nbs->get<uint64_t>();
  s.nested_offset = off->get<float>();  // bitsandbytes holds it as a float32 tensor's item()
  return s;
}

class Cataloger {
 public:
  Cataloger(const std::vector<CheckpointFile>& files,
            const std::function<TensorInfo*(std::string_view)>& find)
      : files_(files), find_(find), reads_(files) {}

  Status Catalog(const TensorInfo& state_tensor, size_t marker) {
    const std::string weight_name = state_tensor.name.substr(0, marker);
    const std::string type = state_tensor.name.substr(marker + kStateMarker.size());
    if (type != "nf4" && type != "fp4") {
      return Refused(state_tensor,
                     fmt::format("names quant type '{}'; bitsandbytes 4-bit is nf4 or fp4", type));
    }
    LOADSTONE_ASSIGN_OR_RETURN(const StateDoc s, ReadState(state_tensor, type));
    TensorInfo* weight = find_(weight_name);
    if (weight == nullptr) return Missing(state_tensor, weight_name);
    uint64_t elements = 1;
    for (uint64_t d : s.shape) {
      if (__builtin_mul_overflow(elements, d, &elements) || elements > (uint64_t{1} << 62)) {
        return Refused(state_tensor, "has a shape of more than 2^62 elements");
      }
    }
    const uint64_t blocks = (elements + s.blocksize - 1) / s.blocksize;
    if (!weight->plain_layout() || weight->packed || weight->nbytes != (elements + 1) / 2) {
      return Refused(*weight, fmt::format("holds {} bytes; its quant state's shape needs {} (two "
                                          "4-bit codes a byte)",
                                          weight->nbytes, (elements + 1) / 2));
    }

    auto state = std::make_shared<Bnb4State>();
    state->fp4 = type == "fp4";
    state->dtype = s.dtype;
    LOADSTONE_RETURN_IF_ERROR(ReadTables(weight_name, s, blocks, state.get()));
    if (s.nested) {
      LOADSTONE_RETURN_IF_ERROR(
          ReadNested(weight_name, s, blocks, Where(state_tensor), state.get()));
    }
    state->companions.push_back(state_tensor.name);

    PackedLayout layout;
    layout.scheme = "bnb-" + type;
    layout.element_shape = s.shape;
    layout.block_elems = static_cast<uint32_t>(s.blocksize);
    layout.block_bytes = static_cast<uint32_t>(s.blocksize / 2);
    layout.bnb4 = std::move(state);
    weight->packed = std::move(layout);
    return Status::OK();
  }

 private:
  std::string Where(const TensorInfo& t) const { return TensorAt(files_, t); }
  Status Refused(const TensorInfo& t, std::string_view why) const {
    return Status::Corruption(fmt::format("bitsandbytes 4-bit {} {}", Where(t), why));
  }
  Status Missing(const TensorInfo& state, const std::string& name) const {
    return Status::NotFound(fmt::format(
        "bitsandbytes 4-bit quant state {} has no tensor '{}' beside it: every shard of the "
        "checkpoint is needed (its index lists where each tensor is)",
        Where(state), name));
  }

  // The quant state in `state_tensor` (1-D uint8 JSON bytes, at most kMaxQuantStateJsonBytes),
  // read and checked; its quant_type must be `type`, the one its name gives.
  Result<StateDoc> ReadState(const TensorInfo& state_tensor, const std::string& type) {
    if ((state_tensor.dtype != DType::kU8 && state_tensor.dtype != DType::kI8) ||
        state_tensor.shape.size() != 1 || !state_tensor.plain_layout()) {
      return Refused(state_tensor, "is not a 1-D tensor of JSON bytes (uint8)");
    }
    if (state_tensor.nbytes > kMaxQuantStateJsonBytes) {
      return BeyondBound(Where(state_tensor), fmt::format("a quant state of {} bytes",
                                                          state_tensor.nbytes),
                         "kMaxQuantStateJsonBytes", kMaxQuantStateJsonBytes);
    }
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> text, reads_.Bytes(state_tensor));
    const std::string what = Where(state_tensor);
    LOADSTONE_ASSIGN_OR_RETURN(
        nlohmann::json doc,
        ParseJsonStrict(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()),
                        what));
    LOADSTONE_ASSIGN_OR_RETURN(StateDoc s,
                               InterpretJson(what, [&] { return ParseState(doc, what); }));
    if (s.quant_type != type) {
      return Refused(state_tensor,
                     fmt::format("says quant_type '{}' under a '{}' name", s.quant_type, type));
    }
    return s;
  }

  // WEIGHT.absmax (`blocks` values: u8 when nested, else f32) and WEIGHT.quant_map (16 f32,
  // bitsandbytes' own table) into `state`, which names them as its companions.
  Status ReadTables(const std::string& weight_name, const StateDoc& s, uint64_t blocks,
                    Bnb4State* state) {
    state->absmax = weight_name + ".absmax";
    LOADSTONE_RETURN_IF_ERROR(
        Companion(state->absmax, s.nested ? DType::kU8 : DType::kF32, blocks).status());
    const std::string quant_map = weight_name + ".quant_map";
    LOADSTONE_ASSIGN_OR_RETURN(const TensorInfo* code, Companion(quant_map, DType::kF32, 16));
    LOADSTONE_ASSIGN_OR_RETURN(state->code, reads_.Floats<16>(*code));
    LOADSTONE_RETURN_IF_ERROR(CheckCode(*code, state->fp4, state->code));
    state->companions = {state->absmax, quant_map};
    return Status::OK();
  }

  // The nested quantization of the absmax values (`blocks` of them): WEIGHT.nested_quant_map
  // (256 f32) and WEIGHT.nested_absmax (f32, one a nested block, at most kMaxNestedAbsmaxBytes),
  // read into `state` and added to its companions. `what` names the quant state.
  Status ReadNested(const std::string& weight_name, const StateDoc& s, uint64_t blocks,
                    const std::string& what, Bnb4State* state) {
    state->nested = true;
    state->nested_blocksize = static_cast<uint32_t>(s.nested_blocksize);
    state->nested_offset = s.nested_offset;
    const std::string nested_map = weight_name + ".nested_quant_map";
    const std::string nested_absmax = weight_name + ".nested_absmax";
    const uint64_t nested_blocks = (blocks + s.nested_blocksize - 1) / s.nested_blocksize;
    if (nested_blocks * 4 > kMaxNestedAbsmaxBytes) {
      return BeyondBound(what, fmt::format("{} nested absmax values", nested_blocks),
                         "kMaxNestedAbsmaxBytes", kMaxNestedAbsmaxBytes);
    }
    LOADSTONE_ASSIGN_OR_RETURN(const TensorInfo* nmap, Companion(nested_map, DType::kF32, 256));
    LOADSTONE_ASSIGN_OR_RETURN(state->nested_code, reads_.Floats<256>(*nmap));
    LOADSTONE_ASSIGN_OR_RETURN(const TensorInfo* nabs,
                               Companion(nested_absmax, DType::kF32, nested_blocks));
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw, reads_.Bytes(*nabs));
    state->nested_absmax.resize(nested_blocks);
    std::memcpy(state->nested_absmax.data(), raw.data(), raw.size());
    state->companions.push_back(nested_map);
    state->companions.push_back(nested_absmax);
    return Status::OK();
  }

  // The companion `name`: present, plain, of `dtype` and `count` elements.
  Result<const TensorInfo*> Companion(const std::string& name, DType dtype, uint64_t count) const {
    const TensorInfo* t = find_(name);
    if (t == nullptr) {
      return Status::NotFound(fmt::format(
          "bitsandbytes 4-bit weight '{}' has no '{}': every shard of the checkpoint is needed",
          name.substr(0, name.rfind('.')), name));
    }
    if (!t->plain_layout()) {
      return Status::Unsupported(fmt::format(
          "{} is stored strided or big-endian; loadstone reads bitsandbytes tables stored "
          "contiguous and little-endian",
          Where(*t)));
    }
    if (t->dtype != dtype || t->numel() != count) {
      return Refused(*t, fmt::format("is {} of {} elements; its quant state needs {} of {}",
                                     TorchName(t->dtype), t->numel(), TorchName(dtype), count));
    }
    return t;
  }

  // The stored quant_map must be bitsandbytes' own table (its kernels decode with that one).
  Status CheckCode(const TensorInfo& t, bool fp4, const std::array<float, 16>& stored) const {
    for (size_t k = 0; k < 16; ++k) {
      const float want = fp4 ? (k < 8 ? 1.0f : -1.0f) * Fp4Magnitudes()[k % 8] : Nf4Code()[k];
      if (stored[k] != want) {  // == : FP4's +0 and -0 for code 8 agree
        return Refused(t, fmt::format("holds {} for code {} where bitsandbytes' {} table has {}",
                                      stored[k], k, fp4 ? "FP4" : "NF4", want));
      }
    }
    return Status::OK();
  }

  const std::vector<CheckpointFile>& files_;
  const std::function<TensorInfo*(std::string_view)>& find_;
  SmallReads reads_;

 public:
  // The LLM.int8 weight beside `scb` ("M.SCB"): M.weight I8 [out, in], M.SCB F32 [out], and
  // M.weight_format (a u8 scalar) when there is one.
  Status CatalogInt8(const TensorInfo& scb, std::string_view module) {
    TensorInfo* weight = find_(std::string(module) + "weight");
    if (weight == nullptr) {
      return Status::NotFound(fmt::format(
          "bitsandbytes int8 row absmax {} has no '{}weight' beside it: every shard of the "
          "checkpoint is needed",
          Where(scb), module));
    }
    if (weight->dtype != DType::kI8 || weight->shape.size() != 2 || !weight->plain_layout() ||
        weight->packed) {
      return Refused(*weight,
                     fmt::format("is {} {}-D beside '{}'; an LLM.int8 weight is a 2-D "
                                 "int8 tensor stored contiguous",
                                 TorchName(weight->dtype), weight->shape.size(), scb.name));
    }
    if (scb.dtype != DType::kF32 || scb.shape != std::vector<uint64_t>{weight->shape[0]} ||
        !scb.plain_layout()) {
      return Refused(scb, fmt::format("is {} {}; the int8 weight '{}' needs float32 [{}] (one "
                                      "absmax per row)",
                                      TorchName(scb.dtype), ShapeText(scb.shape), weight->name,
                                      weight->shape[0]));
    }
    auto state = std::make_shared<BnbInt8State>();
    state->scb = scb.name;
    state->companions = {scb.name};
    const std::string format_name = std::string(module) + "weight_format";
    if (const TensorInfo* format = find_(format_name)) {
      if ((format->dtype != DType::kU8 && format->dtype != DType::kI64 &&
           format->dtype != DType::kI32) ||
          format->numel() != 1 || !format->plain_layout()) {
        return Refused(*format, "is not one integer (bitsandbytes writes a uint8 scalar)");
      }
      LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw, reads_.Bytes(*format));
      uint64_t value = 0;
      std::memcpy(&value, raw.data(), std::min<size_t>(raw.size(), sizeof(value)));
      if (value > 255)
        return Refused(*format, fmt::format("holds {}; a format index is 0 to 3", value));
      state->weight_format = static_cast<uint8_t>(value);
      state->companions.push_back(format_name);
    }
    PackedLayout layout;
    layout.scheme = "bnb-int8";
    layout.element_shape = weight->shape;
    layout.block_elems = static_cast<uint32_t>(std::min<uint64_t>(weight->shape[1], UINT32_MAX));
    layout.block_bytes = layout.block_elems;
    layout.bnb8 = std::move(state);
    weight->packed = std::move(layout);
    return Status::OK();
  }

 private:
  static std::string ShapeText(const std::vector<uint64_t>& shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
  }
};

}  // namespace

const std::array<float, 16>& Nf4Code() {
  static constexpr std::array<float, 16> kCode = {-1.0f,
                                                  -0.6961928009986877f,
                                                  -0.5250730514526367f,
                                                  -0.39491748809814453f,
                                                  -0.28444138169288635f,
                                                  -0.18477343022823334f,
                                                  -0.09105003625154495f,
                                                  0.0f,
                                                  0.07958029955625534f,
                                                  0.16093020141124725f,
                                                  0.24611230194568634f,
                                                  0.33791524171829224f,
                                                  0.44070982933044434f,
                                                  0.5626170039176941f,
                                                  0.7229568362236023f,
                                                  1.0f};
  return kCode;
}

const std::array<float, 8>& Fp4Magnitudes() {
  static constexpr std::array<float, 8> kMagnitude = {
      0.0f, 5.208333333e-03f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f};
  return kMagnitude;
}

Status CatalogBitsandbytes(const std::vector<CheckpointFile>& files,
                           std::vector<TensorInfo>* tensors,
                           const std::function<TensorInfo*(std::string_view)>& find) {
  Cataloger cataloger(files, find);
  for (const TensorInfo& t : *tensors) {
    if (const size_t marker = t.name.rfind(kStateMarker); marker != std::string::npos) {
      LOADSTONE_RETURN_IF_ERROR(cataloger.Catalog(t, marker));
    } else if (t.name == "SCB" || t.name.ends_with(".SCB")) {
      LOADSTONE_RETURN_IF_ERROR(
          cataloger.CatalogInt8(t, std::string_view(t.name).substr(0, t.name.size() - 3)));
    }
  }
  return Status::OK();
}

}  // namespace loadstone::io
