#include "runtime/convert/gguf_blocks.h"

#include <array>

#include <fmt/format.h>

#include "runtime/convert/cast.h"
#include "runtime/convert/gguf_block_decode.h"

namespace loadstone::convert {
namespace {

using gguf::Block;
using gguf::GgufType;
using gguf::kQK;

constexpr std::array<GgufBlockType, 10> kTypes = {{
    {"Q4_0", 32, 18, GgufType::kQ4_0},
    {"Q4_1", 32, 20, GgufType::kQ4_1},
    {"Q5_0", 32, 22, GgufType::kQ5_0},
    {"Q5_1", 32, 24, GgufType::kQ5_1},
    {"Q8_0", 32, 34, GgufType::kQ8_0},
    {"Q2_K", kQK, 84, GgufType::kQ2_K},
    {"Q3_K", kQK, 110, GgufType::kQ3_K},
    {"Q4_K", kQK, 144, GgufType::kQ4_K},
    {"Q5_K", kQK, 176, GgufType::kQ5_K},
    {"Q6_K", kQK, 210, GgufType::kQ6_K},
}};

const GgufBlockType* FindDecoder(std::string_view scheme) {
  for (const GgufBlockType& t : kTypes) {
    if (t.name == scheme) return &t;
  }
  return nullptr;
}

bool IsTarget(DType to) { return to == DType::kF32 || to == DType::kBF16 || to == DType::kF16; }

}  // namespace

const GgufBlockType* FindGgufBlockType(std::string_view scheme) {
  return FindDecoder(scheme);
}

bool CanDequantGguf(std::string_view scheme, DType to) {
  return FindDecoder(scheme) != nullptr && IsTarget(to);
}

Status DequantGgufBlocks(std::string_view scheme, DType to, const std::byte* src, std::byte* dst,
                         uint64_t blocks) {
  const GgufBlockType* decoder = FindDecoder(scheme);
  if (decoder == nullptr || !IsTarget(to)) {
    return Status::InvalidArgument(fmt::format(
        "loadstone cannot dequantize GGUF {} blocks into {} (types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 "
        "Q2_K Q3_K Q4_K Q5_K Q6_K; targets: float32, bfloat16, float16)",
        scheme, TorchName(to)));
  }
  const uint32_t elems = decoder->block_elems, bytes = decoder->block_bytes;
  const uint64_t out_elem = DTypeBits(to) / 8;
  std::array<float, kQK> y{};
  for (uint64_t i = 0; i < blocks; ++i) {
    gguf::DecodeBlock(decoder->id, reinterpret_cast<Block>(src + i * bytes), y.data());
    // Encoded as every f32 source is (a copy into f32).
    LOADSTONE_RETURN_IF_ERROR(CastBuffer(DType::kF32, to, reinterpret_cast<const std::byte*>(y.data()),
                                         dst + i * elems * out_elem, elems));
  }
  return Status::OK();
}

}  // namespace loadstone::convert
