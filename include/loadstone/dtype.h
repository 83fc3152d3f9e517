// DType: the element types loadstone knows, and their names in each format.
//
// Every safetensors dtype is a DType; the safetensors name ("F32", "BF16", ...) and the torch
// name ("float32", "bfloat16", ...) both parse. Packed quantized storage (nf4, GGUF blocks) is
// described by a QuantScheme on the tensor, not by a DType.
#ifndef LOADSTONE_DTYPE_H_
#define LOADSTONE_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace loadstone {

// Declared in the safetensors reference order (its writer sorts by this order, descending).
enum class DType : uint8_t {
  kBool,
  kF4,       // float4 e2m1, two per byte
  kF6E2M3,   // float6, packed
  kF6E3M2,   // float6, packed
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,   // e4m3fn
  kF8E8M0,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

inline constexpr int kNumDTypes = static_cast<int>(DType::kU64) + 1;

// Bits per element: 4 for F4, 6 for F6_*, 8 for BOOL and F8_*, ...
int DTypeBits(DType dtype);

// The safetensors name: "BOOL", "F32", "BF16", "F8_E4M3", ...
std::string_view SafetensorsName(DType dtype);
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);

// The torch name without the "torch." prefix: "float32", "bfloat16", "float8_e4m3fn", ...
std::string_view TorchName(DType dtype);
// Accepts torch names with or without "torch.", their aliases ("float", "half", "long", ...),
// the safetensors names and the short CLI names ("f32", "bf16", "fp16", "f8_e4m3", "fp8" and
// "f8_e4m3fn" for float8_e4m3fn). Case does not matter.
std::optional<DType> ParseDType(std::string_view name);

bool IsFloatingPoint(DType dtype);  // every f*, bf16 and float8; not complex
bool IsInteger(DType dtype);        // u*/i*; not bool

}  // namespace loadstone

#endif  // LOADSTONE_DTYPE_H_
