#include "loadstone/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace loadstone {
namespace {

struct DTypeRow {
  DType dtype;
  int bits;
  std::string_view safetensors;
  std::string_view torch;
};

// One row per DType, in enum order.
constexpr std::array<DTypeRow, kNumDTypes> kRows = {{
    {DType::kBool, 8, "BOOL", "bool"},
    {DType::kF4, 4, "F4", "float4_e2m1fn_x2"},
    {DType::kF6E2M3, 6, "F6_E2M3", "float6_e2m3fn"},
    {DType::kF6E3M2, 6, "F6_E3M2", "float6_e3m2fn"},
    {DType::kU8, 8, "U8", "uint8"},
    {DType::kI8, 8, "I8", "int8"},
    {DType::kF8E5M2, 8, "F8_E5M2", "float8_e5m2"},
    {DType::kF8E4M3, 8, "F8_E4M3", "float8_e4m3fn"},
    {DType::kF8E8M0, 8, "F8_E8M0", "float8_e8m0fnu"},
    {DType::kF8E4M3FNUZ, 8, "F8_E4M3FNUZ", "float8_e4m3fnuz"},
    {DType::kF8E5M2FNUZ, 8, "F8_E5M2FNUZ", "float8_e5m2fnuz"},
    {DType::kI16, 16, "I16", "int16"},
    {DType::kU16, 16, "U16", "uint16"},
    {DType::kF16, 16, "F16", "float16"},
    {DType::kBF16, 16, "BF16", "bfloat16"},
    {DType::kI32, 32, "I32", "int32"},
    {DType::kU32, 32, "U32", "uint32"},
    {DType::kF32, 32, "F32", "float32"},
    {DType::kC64, 64, "C64", "complex64"},
    {DType::kF64, 64, "F64", "float64"},
    {DType::kI64, 64, "I64", "int64"},
    {DType::kU64, 64, "U64", "uint64"},
}};

const DTypeRow& Row(DType dtype) { return kRows[static_cast<size_t>(dtype)]; }

struct Alias {
  std::string_view name;
  DType dtype;
};

// Lower-case aliases beyond the torch and safetensors names.
constexpr Alias kAliases[] = {
    {"float", DType::kF32},  {"half", DType::kF16},     {"double", DType::kF64},
    {"long", DType::kI64},   {"int", DType::kI32},      {"short", DType::kI16},
    {"f32", DType::kF32},    {"fp32", DType::kF32},     {"f16", DType::kF16},
    {"fp16", DType::kF16},   {"bf16", DType::kBF16},    {"f64", DType::kF64},
    {"fp64", DType::kF64},   {"f8_e4m3", DType::kF8E4M3}, {"fp8_e4m3", DType::kF8E4M3},
    {"f8_e5m2", DType::kF8E5M2}, {"fp8_e5m2", DType::kF8E5M2}, {"cfloat", DType::kC64},
    {"fp8", DType::kF8E4M3},     {"f8", DType::kF8E4M3},       {"f8_e4m3fn", DType::kF8E4M3},
    {"fp8_e4m3fn", DType::kF8E4M3}, {"float8", DType::kF8E4M3}, {"f8_e8m0", DType::kF8E8M0},
};

}  // namespace

int DTypeBits(DType dtype) { return Row(dtype).bits; }
std::string_view SafetensorsName(DType dtype) { return Row(dtype).safetensors; }
std::string_view TorchName(DType dtype) { return Row(dtype).torch; }

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const DTypeRow& row : kRows) {
    if (row.safetensors == name) return row.dtype;
  }
  return std::nullopt;
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (auto exact = DTypeFromSafetensorsName(name)) return exact;
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const DTypeRow& row : kRows) {
    if (row.torch == lower) return row.dtype;
  }
  for (const Alias& alias : kAliases) {
    if (alias.name == lower) return alias.dtype;
  }
  return std::nullopt;
}

bool IsFloatingPoint(DType dtype) {
  switch (dtype) {
    case DType::kF4: case DType::kF6E2M3: case DType::kF6E3M2: case DType::kF8E5M2:
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kF8E4M3FNUZ:
    case DType::kF8E5M2FNUZ: case DType::kF16: case DType::kBF16: case DType::kF32:
    case DType::kF64:
      return true;
    default:
      return false;
  }
}

bool IsInteger(DType dtype) {
  switch (dtype) {
    case DType::kU8: case DType::kI8: case DType::kI16: case DType::kU16: case DType::kI32:
    case DType::kU32: case DType::kI64: case DType::kU64:
      return true;
    default:
      return false;
  }
}

}  // namespace loadstone
