#include "runtime/convert/bitsandbytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "runtime/convert/dequant_element.h"
#include "runtime/convert/float_bits.h"

namespace loadstone::convert {
namespace {

float AbsmaxOf(const Bnb4State& s, const std::byte* absmax, uint64_t block) {
  if (!s.nested) {
    float a;
    std::memcpy(&a, absmax + block * 4, 4);
    return a;
  }
  return Bnb4NestedAbsmax(s.nested_code.data(), s.nested_absmax.data(), s.nested_blocksize,
                          s.nested_offset, static_cast<uint8_t>(absmax[block]), block);
}

// The f32 value of each nibble in a block whose absmax is `a`.
std::array<uint32_t, 16> BlockValues(const Bnb4State& s, float a) {
  std::array<uint32_t, 16> v{};
  for (uint32_t k = 0; k < 16; ++k) {
    v[k] = std::bit_cast<uint32_t>(Bnb4Value(s.fp4, s.code.data(), k, a));
  }
  return v;
}

template <typename Out, Out (*Encode)(uint32_t)>
void Decode(const Bnb4State& s, uint64_t blocksize, const std::byte* packed, uint64_t first,
            uint64_t count, const std::byte* absmax, std::byte* dst) {
  const uint64_t base = first & ~uint64_t{1};  // the element of packed[0]'s high nibble
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t block = e / blocksize;
    const uint64_t run_end = std::min(end, (block + 1) * blocksize);
    std::array<Out, 16> lut;
    const auto values = BlockValues(s, AbsmaxOf(s, absmax, block));
    for (size_t k = 0; k < 16; ++k) lut[k] = Encode(values[k]);
    // Stores go through memcpy: dst has any alignment.
    auto put = [&](uint64_t at, unsigned code) {
      std::memcpy(dst + (at - first) * sizeof(Out), &lut[code], sizeof(Out));
    };
    const auto* bytes = reinterpret_cast<const uint8_t*>(packed);
    if (e < run_end && (e & 1)) {  // a low nibble first
      put(e, bytes[(e - base) / 2] & 0x0F);
      ++e;
    }
    for (; e + 1 < run_end; e += 2) {  // whole bytes: the high nibble, then the low one
      const uint8_t byte = bytes[(e - base) / 2];
      put(e, byte >> 4);
      put(e + 1, byte & 0x0F);
    }
    if (e < run_end) {  // a high nibble last
      put(e, bytes[(e - base) / 2] >> 4);
      ++e;
    }
  }
}

constexpr uint32_t Identity(uint32_t f) { return f; }

template <typename Out, Out (*Encode)(uint32_t)>
void DecodeInt8(const std::byte* codes, uint64_t first, uint64_t count, uint64_t cols,
                const std::byte* scb, std::byte* dst) {
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t row = e / cols;
    const uint64_t run_end = std::min(end, (row + 1) * cols);
    float absmax;
    std::memcpy(&absmax, scb + row * 4, 4);
    for (; e < run_end; ++e) {
      const float x = BnbInt8Value(static_cast<int8_t>(codes[e - first]), absmax);
      const Out v = Encode(std::bit_cast<uint32_t>(x));
      std::memcpy(dst + (e - first) * sizeof(Out), &v, sizeof(Out));
    }
  }
}

}  // namespace

bool CanDequantBnb4(DType to) {
  return to == DType::kF32 || to == DType::kF16 || to == DType::kBF16;
}

Status DequantBnb4(const PackedLayout& layout, DType to, const std::byte* packed, uint64_t first,
                   uint64_t count, const std::byte* absmax, std::byte* dst) {
  if (!layout.bnb4 || layout.block_elems == 0) {
    return Status::InvalidArgument(
        fmt::format("'{}' is not a bitsandbytes 4-bit layout", layout.scheme));
  }
  if (!CanDequantBnb4(to)) {
    return Status::InvalidArgument(
        fmt::format("cannot dequantize {} into {}: float32, float16 or bfloat16 only",
                    layout.scheme, TorchName(to)));
  }
  uint64_t elements = 1;
  for (uint64_t d : layout.element_shape) elements *= d;
  if (first > elements || count > elements - first) {
    return Status::InvalidArgument(fmt::format("elements [{}, {}) of a {} weight of {}", first,
                                               first + count, layout.scheme, elements));
  }
  const Bnb4State& s = *layout.bnb4;
  switch (to) {
    case DType::kF32:
      Decode<uint32_t, Identity>(s, layout.block_elems, packed, first, count, absmax, dst);
      break;
    case DType::kF16:
      Decode<uint16_t, F32ToF16Bits>(s, layout.block_elems, packed, first, count, absmax, dst);
      break;
    default:
      Decode<uint16_t, F32ToBF16Bits>(s, layout.block_elems, packed, first, count, absmax, dst);
      break;
  }
  return Status::OK();
}

Status DequantBnbInt8(DType to, const std::byte* codes, uint64_t first, uint64_t count,
                      uint64_t cols, const std::byte* scb, std::byte* dst) {
  if (!CanDequantBnb4(to) || cols == 0) {
    return Status::InvalidArgument(fmt::format(
        "cannot dequantize an int8 weight of {} columns into {}: float32, float16 or bfloat16 only",
        cols, TorchName(to)));
  }
  switch (to) {
    case DType::kF32:
      DecodeInt8<uint32_t, Identity>(codes, first, count, cols, scb, dst);
      break;
    case DType::kF16:
      DecodeInt8<uint16_t, F32ToF16Bits>(codes, first, count, cols, scb, dst);
      break;
    default:
      DecodeInt8<uint16_t, F32ToBF16Bits>(codes, first, count, cols, scb, dst);
      break;
  }
  return Status::OK();
}

}  // namespace loadstone::convert
