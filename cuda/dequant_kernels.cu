// The dequant kernels: one output element per thread step, grid-stride. The per-element work is
// runtime/convert/dequant_element.h and float_bits.h compiled for the device
// (--expt-relaxed-constexpr), the same definitions the CPU decoders run; built with -fmad=false
// so that no multiply and add fuse. Compiled, not yet run on a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <string>

#include "cuda/cuda_error.h"
#include "cuda/dequant_kernels.h"
#include "cuda/launch_geometry.h"
#include "runtime/convert/dequant_element.h"
#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/convert/gguf_blocks.h"
#include "runtime/convert/packed_int.h"

namespace loadstone::cuda {
namespace {

namespace cv = ::loadstone::convert;

// f32 bits into the target's bits.
struct ToF32 {
  using Out = uint32_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return f; }
};
struct ToF16 {
  using Out = uint16_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return cv::F32ToF16Bits(f); }
};
struct ToBF16 {
  using Out = uint16_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return cv::F32ToBF16Bits(f); }
};

__device__ __forceinline__ uint64_t GlobalThread() {
  return uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridStride() { return uint64_t{gridDim.x} * blockDim.x; }

template <typename Enc>
__device__ __forceinline__ void Put(std::byte* dst, uint64_t i, uint32_t f32_bits) {
  const typename Enc::Out v = Enc{}(f32_bits);
  memcpy(dst + i * sizeof(v), &v, sizeof(v));  // dst has any alignment
}

template <PackOrder kOrder, typename Enc>
__global__ void PackedIntKernel(DevicePackedInt s, cv::PackedCodes codes, uint32_t scale_bytes,
                                const std::byte* __restrict__ scales, uint64_t first,
                                uint64_t count, std::byte* __restrict__ dst) {
  for (uint64_t i = GlobalThread(); i < count; i += GridStride()) {
    const uint64_t e = first + i;
    const uint64_t r = e / s.cols, c = e % s.cols;
    const uint64_t g = s.g_idx != nullptr ? static_cast<uint64_t>(s.g_idx[c]) : c / s.group_size;
    const uint64_t at = kOrder == PackOrder::kRows ? r * s.groups + g : g * s.rows + r;
    uint32_t raw = 0;
    for (uint32_t b = 0; b < scale_bytes; ++b) {
      raw |= static_cast<uint32_t>(scales[at * scale_bytes + b]) << (8 * b);
    }
    const int32_t zero = s.zeros != nullptr ? s.zeros[r * s.groups + g] : 1 << (s.bits - 1);
    const auto diff = static_cast<int32_t>(codes.At<kOrder>(r, c)) - zero;
    Put<Enc>(
        dst, i,
        cv::PackedIntValueBits(diff, cv::Fp8ScaleToF32Bits(raw, s.scale_dtype), s.scale_dtype));
  }
}

template <typename Enc>
__global__ void Bnb4Kernel(DeviceBnb4 s, const std::byte* __restrict__ packed,
                           const std::byte* __restrict__ absmax, uint64_t first, uint64_t count,
                           std::byte* __restrict__ dst) {
  const uint64_t base = first & ~uint64_t{1};  // the element of packed[0]'s high nibble
  for (uint64_t i = GlobalThread(); i < count; i += GridStride()) {
    const uint64_t e = first + i;
    const uint64_t block = e / s.blocksize;
    const float a =
        s.nested ? cv::Bnb4NestedAbsmax(s.nested_code, s.nested_absmax, s.nested_blocksize,
                                        s.nested_offset, static_cast<uint8_t>(absmax[block]), block)
                 : std::bit_cast<float>(cv::LoadWord(absmax + 4 * block));
    const auto byte = static_cast<uint8_t>(packed[(e - base) / 2]);
    const unsigned k = (e & 1) ? byte & 0x0F : byte >> 4;
    Put<Enc>(dst, i, std::bit_cast<uint32_t>(cv::Bnb4Value(s.fp4, s.code, k, a)));
  }
}

template <typename Enc>
__global__ void BnbInt8Kernel(const std::byte* __restrict__ codes, uint64_t first, uint64_t count,
                              uint64_t cols, const std::byte* __restrict__ scb,
                              std::byte* __restrict__ dst) {
  for (uint64_t i = GlobalThread(); i < count; i += GridStride()) {
    const uint64_t row = (first + i) / cols;
    const float absmax = std::bit_cast<float>(cv::LoadWord(scb + 4 * row));
    const auto q = static_cast<int8_t>(codes[i]);
    Put<Enc>(dst, i, std::bit_cast<uint32_t>(cv::BnbInt8Value(q, absmax)));
  }
}

// One GGUF block a step: its values decoded into local memory, then encoded.
template <typename Enc>
__global__ void GgufKernel(cv::gguf::GgufType type, uint32_t elems, uint32_t bytes,
                           const std::byte* __restrict__ src, uint64_t blocks,
                           std::byte* __restrict__ dst) {
  float y[cv::gguf::kQK];
  for (uint64_t i = GlobalThread(); i < blocks; i += GridStride()) {
    cv::gguf::DecodeBlock(type, reinterpret_cast<const uint8_t*>(src + i * bytes), y);
    for (uint32_t k = 0; k < elems; ++k)
      Put<Enc>(dst, i * elems + k, std::bit_cast<uint32_t>(y[k]));
  }
}

uint32_t Blocks(uint64_t count, uint32_t sm_count) {
  const uint64_t wanted = (count + kCastThreads - 1) / kCastThreads;
  const uint64_t cap = uint64_t{std::max(1u, sm_count)} * kCastBlocksPerSm;
  return static_cast<uint32_t>(std::min({wanted, cap, uint64_t{kMaxGridX}}));
}

// Runs `launch` with the encoder of `to` as its template argument.
template <typename Launch>
Status WithEncoder(DType to, const std::string& what, int device, const Launch& launch) {
  switch (to) {
    case DType::kF32:
      launch(ToF32{});
      break;
    case DType::kF16:
      launch(ToF16{});
      break;
    case DType::kBF16:
      launch(ToBF16{});
      break;
    default:
      return Status::InvalidArgument(DeviceName(device) + ": no " + what + " into " +
                                     std::string(TorchName(to)) +
                                     ": float32, float16 or bfloat16 only");
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::OK() : CudaErrorStatus(static_cast<int>(err), {what, device});
}

}  // namespace

DevicePackedInt DeviceStateOf(const PackedIntState& state, const int16_t* zeros,
                              const int32_t* g_idx) {
  DevicePackedInt d;
  d.bits = state.bits;
  d.order = state.order;
  d.rows = state.rows;
  d.cols = state.cols;
  d.groups = state.groups;
  d.group_size = state.group_size;
  d.scale_dtype = state.scale_dtype;
  d.zeros = state.zeros.empty() ? nullptr : zeros;
  d.g_idx = state.g_idx.empty() ? nullptr : g_idx;
  return d;
}

DeviceBnb4 DeviceStateOf(const PackedLayout& layout, const float* nested_code,
                         const float* nested_absmax) {
  const Bnb4State& s = *layout.bnb4;
  DeviceBnb4 d;
  d.fp4 = s.fp4;
  for (size_t k = 0; k < 16; ++k) d.code[k] = s.code[k];
  d.blocksize = layout.block_elems;
  d.nested = s.nested;
  d.nested_blocksize = s.nested_blocksize;
  d.nested_offset = s.nested_offset;
  d.nested_code = s.nested ? nested_code : nullptr;
  d.nested_absmax = s.nested ? nested_absmax : nullptr;
  return d;
}

bool CanDequantOnDevice(DType to) {
  return to == DType::kF32 || to == DType::kF16 || to == DType::kBF16;
}

Status LaunchDequantPackedInt(const DevicePackedInt& state, DType to, const std::byte* words,
                              uint64_t first_word, uint64_t first, uint64_t count,
                              const std::byte* scales, std::byte* dst, void* stream,
                              uint32_t sm_count, int device) {
  const std::string what = "packed-integer dequant kernel";
  const bool widths = state.order == PackOrder::kRows
                          ? state.bits == 2 || state.bits == 4 || state.bits == 8
                      : state.order == PackOrder::kGptq
                          ? state.bits == 2 || state.bits == 3 || state.bits == 4 || state.bits == 8
                          : state.bits == 4 && state.rows % 8 == 0;
  const bool scale_dtype = state.scale_dtype == DType::kF32 || state.scale_dtype == DType::kF16 ||
                           state.scale_dtype == DType::kBF16;
  if (!widths || !scale_dtype || state.cols == 0 || state.groups == 0 ||
      (state.g_idx == nullptr && state.group_size == 0) || first > state.rows * state.cols ||
      count > state.rows * state.cols - first) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a bad state or range");
  }
  if (count == 0) return Status::OK();
  if (words == nullptr || scales == nullptr || dst == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  const cv::PackedCodes codes{words,      first_word,
                              state.rows, (state.cols * state.bits + 31) / 32,
                              state.bits, static_cast<unsigned>(std::countr_zero(32 / state.bits))};
  const auto scale_bytes = static_cast<uint32_t>(DTypeBits(state.scale_dtype) / 8);
  const auto s = static_cast<cudaStream_t>(stream);
  const uint32_t blocks = Blocks(count, sm_count);
  return WithEncoder(to, what, device, [&](auto enc) {
    using Enc = decltype(enc);
    switch (state.order) {
      case PackOrder::kRows:
        PackedIntKernel<PackOrder::kRows, Enc>
            <<<blocks, kCastThreads, 0, s>>>(state, codes, scale_bytes, scales, first, count, dst);
        break;
      case PackOrder::kGptq:
        PackedIntKernel<PackOrder::kGptq, Enc>
            <<<blocks, kCastThreads, 0, s>>>(state, codes, scale_bytes, scales, first, count, dst);
        break;
      case PackOrder::kAwq:
        PackedIntKernel<PackOrder::kAwq, Enc>
            <<<blocks, kCastThreads, 0, s>>>(state, codes, scale_bytes, scales, first, count, dst);
        break;
    }
  });
}

Status LaunchDequantBnb4(const DeviceBnb4& state, DType to, const std::byte* packed, uint64_t first,
                         uint64_t count, const std::byte* absmax, std::byte* dst, void* stream,
                         uint32_t sm_count, int device) {
  const std::string what = "bitsandbytes 4-bit dequant kernel";
  if (state.blocksize == 0 ||
      (state.nested && (state.nested_blocksize == 0 || state.nested_code == nullptr ||
                        state.nested_absmax == nullptr))) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a bad state");
  }
  if (count == 0) return Status::OK();
  if (packed == nullptr || absmax == nullptr || dst == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  const uint32_t blocks = Blocks(count, sm_count);
  return WithEncoder(to, what, device, [&](auto enc) {
    Bnb4Kernel<decltype(enc)><<<blocks, kCastThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        state, packed, absmax, first, count, dst);
  });
}

Status LaunchDequantBnbInt8(DType to, const std::byte* codes, uint64_t first, uint64_t count,
                            uint64_t cols, const std::byte* scb, std::byte* dst, void* stream,
                            uint32_t sm_count, int device) {
  const std::string what = "LLM.int8 dequant kernel";
  if (cols == 0) return Status::InvalidArgument(DeviceName(device) + ": " + what + " of 0 columns");
  if (count == 0) return Status::OK();
  if (codes == nullptr || scb == nullptr || dst == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  const uint32_t blocks = Blocks(count, sm_count);
  return WithEncoder(to, what, device, [&](auto enc) {
    BnbInt8Kernel<decltype(enc)><<<blocks, kCastThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        codes, first, count, cols, scb, dst);
  });
}

Status LaunchQuantJob(const device::PlaceJob& job, const std::byte* src, void* stream,
                      uint32_t sm_count, int device) {
  const device::QuantDecode& q = *job.quant;
  switch (q.conversion) {
    case Conversion::kDequantPackedInt: {
      const PackedIntState& s = *q.layout.packed_int;
      return LaunchDequantPackedInt(DeviceStateOf(s, q.zeros, q.g_idx), job.to, src,
                                    convert::WordOf(s, job.first), job.first, job.count, q.scales,
                                    job.dst, stream, sm_count, device);
    }
    case Conversion::kDequantBnb4:
      return LaunchDequantBnb4(DeviceStateOf(q.layout, q.nested_code, q.nested_absmax), job.to, src,
                               job.first, job.count, q.scales, job.dst, stream, sm_count, device);
    case Conversion::kDequantBnb8:
      return LaunchDequantBnbInt8(job.to, src, job.first, job.count, q.int8_cols, q.scales, job.dst,
                                  stream, sm_count, device);
    case Conversion::kDequantBlocks: {
      const cv::GgufBlockType* type = cv::FindGgufBlockType(q.layout.scheme);
      if (type == nullptr) break;
      return LaunchDequantGgufBlocks(q.layout.scheme, job.to, src, job.dst,
                                     job.count / type->block_elems, stream, sm_count, device);
    }
    default:
      break;
  }
  return Status::InvalidArgument(DeviceName(device) + ": no kernel decodes " + q.layout.scheme +
                                 " weights");
}

Status LaunchDequantGgufBlocks(std::string_view scheme, DType to, const std::byte* src,
                               std::byte* dst, uint64_t blocks, void* stream, uint32_t sm_count,
                               int device) {
  const cv::GgufBlockType* type = cv::FindGgufBlockType(scheme);
  const std::string what = "GGUF " + std::string(scheme) + " dequant kernel";
  if (type == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": no " + what +
                                   " (types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K)");
  }
  if (blocks == 0) return Status::OK();
  if (src == nullptr || dst == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  const uint32_t grid = Blocks(blocks, sm_count);
  return WithEncoder(to, what, device, [&](auto enc) {
    GgufKernel<decltype(enc)><<<grid, kCastThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        type->id, type->block_elems, type->block_bytes, src, blocks, dst);
  });
}

}  // namespace loadstone::cuda
