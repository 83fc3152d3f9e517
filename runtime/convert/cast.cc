#include "runtime/convert/cast.h"

#include <bit>
#include <cstring>
#include <string>

#include "runtime/convert/buffer_map.h"
#include "runtime/convert/float_bits.h"

namespace loadstone::convert {
namespace {

static_assert(std::endian::native == std::endian::little,
              "buffers are little-endian; a big-endian host needs byte swaps here");

using Kernel = void (*)(const std::byte*, std::byte*, uint64_t);

// One kernel per (from, to) pair; the per-element work is inlined, the call is per buffer.
LOADSTONE_CLONES void F32ToBF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint32_t, uint16_t>(s, d, n, F32ToBF16Bits);
}
LOADSTONE_CLONES void F32ToF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint32_t, uint16_t>(s, d, n, F32ToF16Bits);
}
LOADSTONE_CLONES void BF16ToF32(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint16_t, uint32_t>(s, d, n, BF16ToF32Bits);
}
LOADSTONE_CLONES void BF16ToF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint16_t, uint16_t>(s, d, n, [](uint16_t b) { return F32ToF16Bits(BF16ToF32Bits(b)); });
}
LOADSTONE_CLONES void F16ToF32(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint16_t, uint32_t>(s, d, n, F16ToF32Bits);
}
LOADSTONE_CLONES void F16ToBF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint16_t, uint16_t>(s, d, n, [](uint16_t h) { return F32ToBF16Bits(F16ToF32Bits(h)); });
}
LOADSTONE_CLONES void F64ToF32(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint64_t, uint32_t>(s, d, n, F64ToF32Bits);
}
LOADSTONE_CLONES void F64ToF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint64_t, uint16_t>(s, d, n, [](uint64_t x) { return F32ToF16Bits(F64ToF32Bits(x)); });
}
LOADSTONE_CLONES void F64ToBF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint64_t, uint16_t>(s, d, n, [](uint64_t x) { return F32ToBF16Bits(F64ToF32Bits(x)); });
}
LOADSTONE_CLONES void E4M3ToF32(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint32_t>(s, d, n, F8E4M3ToF32Bits);
}
LOADSTONE_CLONES void E4M3ToF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint16_t>(s, d, n, F8E4M3ToF16Bits);
}
LOADSTONE_CLONES void E4M3ToBF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint16_t>(s, d, n, F8E4M3ToBF16Bits);
}
LOADSTONE_CLONES void E5M2ToF32(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint32_t>(s, d, n, F8E5M2ToF32Bits);
}
LOADSTONE_CLONES void E5M2ToF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint16_t>(s, d, n, F8E5M2ToF16Bits);
}
LOADSTONE_CLONES void E5M2ToBF16(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint8_t, uint16_t>(s, d, n, F8E5M2ToBF16Bits);
}

LOADSTONE_CLONES void F32ToE4M3(const std::byte* s, std::byte* d, uint64_t n) {
  Map<uint32_t, uint8_t>(s, d, n, F32ToF8E4M3Bits);
}

Kernel FindKernel(DType from, DType to) {
  switch (from) {
    case DType::kF32:
      return to == DType::kBF16 ? F32ToBF16 : to == DType::kF16 ? F32ToF16 : nullptr;
    case DType::kBF16:
      return to == DType::kF32 ? BF16ToF32 : to == DType::kF16 ? BF16ToF16 : nullptr;
    case DType::kF16:
      return to == DType::kF32 ? F16ToF32 : to == DType::kBF16 ? F16ToBF16 : nullptr;
    case DType::kF64:
      return to == DType::kF32    ? F64ToF32
             : to == DType::kF16  ? F64ToF16
             : to == DType::kBF16 ? F64ToBF16
                                  : nullptr;
    case DType::kF8E4M3:
      return to == DType::kF32    ? E4M3ToF32
             : to == DType::kF16  ? E4M3ToF16
             : to == DType::kBF16 ? E4M3ToBF16
                                  : nullptr;
    case DType::kF8E5M2:
      return to == DType::kF32    ? E5M2ToF32
             : to == DType::kF16  ? E5M2ToF16
             : to == DType::kBF16 ? E5M2ToBF16
                                  : nullptr;
    default:
      return nullptr;
  }
}

}  // namespace

bool CanCast(DType from, DType to) { return from == to || FindKernel(from, to) != nullptr; }

uint64_t ElementBytes(DType dtype, uint64_t count) {
  const auto bits = static_cast<uint64_t>(DTypeBits(dtype));
  return bits % 8 == 0 ? count * (bits / 8) : (count * bits + 7) / 8;
}

Status CastBuffer(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t count) {
  if (from == to) {
    if (count != 0) std::memmove(dst, src, ElementBytes(from, count));
    return Status::OK();
  }
  const Kernel kernel = FindKernel(from, to);
  if (kernel == nullptr) {
    return Status::InvalidArgument(std::string("cannot cast ") + std::string(TorchName(from)) +
                                   " to " + std::string(TorchName(to)) +
                                   ": only float32/float16/bfloat16/float64/float8_e4m3fn/"
                                   "float8_e5m2 convert, and only to float32/float16/bfloat16");
  }
  kernel(src, dst, count);
  return Status::OK();
}

void CastF32ToF8E4M3(const std::byte* src, std::byte* dst, uint64_t count) {
  F32ToE4M3(src, dst, count);
}

}  // namespace loadstone::convert
