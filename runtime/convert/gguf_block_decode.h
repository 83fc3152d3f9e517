// The GGUF block decoders (specs/quant.md, "GGUF blocks"; ggml's dequantize_row_*): each fills
// y[0 .. block_elems) with the f32 values of one block, in the producers' order of operations —
// the multiply and the add rounded separately, never fused. constexpr, so that the CPU reference
// (gguf_blocks.cc, built with -ffp-contract=off) and the CUDA kernels (cuda/dequant_kernels.cu,
// --expt-relaxed-constexpr, -fmad=false) run one definition.
#ifndef LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCK_DECODE_H_
#define LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCK_DECODE_H_

#include <bit>
#include <cstdint>

#include "runtime/convert/float_bits.h"

namespace loadstone::convert::gguf {

using Block = const uint8_t*;
inline constexpr uint32_t kQK = 256;  // a K-quant super-block's elements

// The IEEE half at b[0..1], little-endian, as f32 (exact).
constexpr float Half(Block b) {
  return std::bit_cast<float>(F16ToF32Bits(static_cast<uint16_t>(b[0] | (b[1] << 8))));
}

constexpr uint32_t U32(Block b) {
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

// Each decoder fills y[0 .. block_elems) with f32 values, in the producers' order of operations.

constexpr void Q4_0(Block b, float* y) {  // half d; u8 qs[16]: low nibbles first, then high
  const float d = Half(b);
  const Block qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 15) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

constexpr void Q4_1(Block b, float* y) {  // half d, m; u8 qs[16]
  const float d = Half(b), m = Half(b + 2);
  const Block qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 15) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

constexpr void Q5_0(Block b,
                    float* y) {  // half d; u32 qh (bit j: element j's fifth bit); u8 qs[16]
  const float d = Half(b);
  const uint32_t qh = U32(b + 2);
  const Block qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

constexpr void Q5_1(Block b, float* y) {  // half d, m; u32 qh; u8 qs[16]
  const float d = Half(b), m = Half(b + 2);
  const uint32_t qh = U32(b + 4);
  const Block qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

constexpr void Q8_0(Block b, float* y) {  // half d; i8 qs[32]
  const float d = Half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: u8 scales[16] (low nibble: scale, high: min, of each 16 elements); u8 qs[64] (2 bits
// each: element 128h + 32k + l is bits 2k of qs[32h + l]); half d; half dmin — d at the end.
constexpr void Q2_K(Block b, float* y) {
  const Block scales = b, qs = b + 16;
  const float d = Half(b + 80), dmin = Half(b + 82);
  for (uint32_t e = 0; e < kQK; ++e) {
    const uint32_t h = e / 128, k = (e % 128) / 32, l = e % 32, s = e / 16;
    const float dl = d * static_cast<float>(scales[s] & 0xF);
    const float ml = dmin * static_cast<float>(scales[s] >> 4);
    const float q = static_cast<float>((qs[32 * h + l] >> (2 * k)) & 3);
    y[e] = dl * q - ml;
  }
}

// Q3_K: u8 hmask[32] (bit k of hmask[l]: element 32k + l's high bit, set = no offset); u8 qs[64]
// (low 2 bits, as Q2_K); u8 scales[12] (sixteen 6-bit signed scales, biased by 32); half d.
constexpr void Q3_K(Block b, float* y) {
  const Block hmask = b, qs = b + 32, packed = b + 96;
  const float d = Half(b + 108);
  float dl[16] = {};
  for (uint32_t i = 0; i < 16; ++i) {
    const uint32_t low = (packed[i % 8] >> (4 * (i / 8))) & 0xF;
    const uint32_t high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * static_cast<float>(static_cast<int>(low | (high << 4)) - 32);
  }
  for (uint32_t e = 0; e < kQK; ++e) {
    const uint32_t h = e / 128, k = (e % 128) / 32, l = e % 32;
    const int low = (qs[32 * h + l] >> (2 * k)) & 3;
    const int offset = ((hmask[l] >> (e / 32)) & 1) ? 0 : 4;
    y[e] = dl[e / 16] * static_cast<float>(low - offset);
  }
}

// The eight 6-bit scales and mins of a Q4_K / Q5_K super-block, from its 12 bytes.
constexpr void ScaleMin(Block s, uint32_t j, uint32_t* sc, uint32_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K: half d, dmin; u8 scales[12]; u8 qs[128] (sub-block 2c: low nibbles of qs[32c ..], 2c+1:
// their high nibbles). Q5_K: the same with u8 qh[32] before qs (bit j of qh[l]: the fifth bit of
// element 32j + l); `qh` is null for Q4_K.
constexpr void Q45_K(Block b, Block qh, Block qs, float* y) {
  const float d = Half(b), dmin = Half(b + 2);
  const Block scales = b + 4;
  for (uint32_t j = 0; j < 8; ++j) {
    uint32_t sc = 0, m = 0;
    ScaleMin(scales, j, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const Block q = qs + 32 * (j / 2);
    for (uint32_t l = 0; l < 32; ++l) {
      uint32_t v = (q[l] >> (4 * (j % 2))) & 0xF;
      if (qh != nullptr) v |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

constexpr void Q4_K(Block b, float* y) { Q45_K(b, nullptr, b + 16, y); }
constexpr void Q5_K(Block b, float* y) { Q45_K(b, b + 16, b + 48, y); }

// Q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; half d — d at the end. Element 128h + r takes
// nibble r / 64 of ql[64h + r % 64] and bits 2 (r / 32) of qh[32h + r % 32], biased by 32.
constexpr void Q6_K(Block b, float* y) {
  const Block ql = b, qh = b + 128;
  const Block scales = b + 192;  // i8
  const float d = Half(b + 208);
  for (uint32_t e = 0; e < kQK; ++e) {
    const uint32_t h = e / 128, r = e % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(static_cast<int8_t>(scales[e / 16]));
    y[e] = ds * static_cast<float>((low | (high << 4)) - 32);
  }
}

// The ten block types, in the order of GgufType's values.
enum class GgufType : uint8_t {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K
};

constexpr void DecodeBlock(GgufType type, Block b, float* y) {
  switch (type) {
    case GgufType::kQ4_0:
      return Q4_0(b, y);
    case GgufType::kQ4_1:
      return Q4_1(b, y);
    case GgufType::kQ5_0:
      return Q5_0(b, y);
    case GgufType::kQ5_1:
      return Q5_1(b, y);
    case GgufType::kQ8_0:
      return Q8_0(b, y);
    case GgufType::kQ2_K:
      return Q2_K(b, y);
    case GgufType::kQ3_K:
      return Q3_K(b, y);
    case GgufType::kQ4_K:
      return Q4_K(b, y);
    case GgufType::kQ5_K:
      return Q5_K(b, y);
    case GgufType::kQ6_K:
      return Q6_K(b, y);
  }
}

}  // namespace loadstone::convert::gguf

#endif  // LOADSTONE_RUNTIME_CONVERT_GGUF_BLOCK_DECODE_H_
