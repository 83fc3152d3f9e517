// The cast kernels: one 16-byte load per thread step (vector path) or one element per step
// (tail, unaligned pointers), grid-stride. The per-element work is runtime/convert's scalar
// contract (float_bits.h), compiled for the device (--expt-relaxed-constexpr), so the GPU and
// the CPU reference share one definition of every rounding rule. Built without fast-math:
// the subnormal paths rely on IEEE float addition with denormals kept (no flush to zero).
#include "cuda/cast_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_error.h"
#include "cuda/launch_geometry.h"
#include "runtime/convert/float_bits.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::cuda {
namespace {

namespace cv = ::loadstone::convert;

// One functor per conversion: In and Out are the raw bit types.
#define LOADSTONE_CAST_OP(NAME, IN, OUT, EXPR)                    \
  struct NAME {                                                   \
    using In = IN;                                                \
    using Out = OUT;                                              \
    __device__ __forceinline__ Out operator()(In x) const { return EXPR; } \
  };

LOADSTONE_CAST_OP(F32ToBF16, uint32_t, uint16_t, cv::F32ToBF16Bits(x))
LOADSTONE_CAST_OP(F32ToF16, uint32_t, uint16_t, cv::F32ToF16Bits(x))
LOADSTONE_CAST_OP(BF16ToF32, uint16_t, uint32_t, cv::BF16ToF32Bits(x))
LOADSTONE_CAST_OP(BF16ToF16, uint16_t, uint16_t, cv::F32ToF16Bits(cv::BF16ToF32Bits(x)))
LOADSTONE_CAST_OP(F16ToF32, uint16_t, uint32_t, cv::F16ToF32Bits(x))
LOADSTONE_CAST_OP(F16ToBF16, uint16_t, uint16_t, cv::F32ToBF16Bits(cv::F16ToF32Bits(x)))
LOADSTONE_CAST_OP(F64ToF32, uint64_t, uint32_t, cv::F64ToF32Bits(x))
LOADSTONE_CAST_OP(F64ToF16, uint64_t, uint16_t, cv::F32ToF16Bits(cv::F64ToF32Bits(x)))
LOADSTONE_CAST_OP(F64ToBF16, uint64_t, uint16_t, cv::F32ToBF16Bits(cv::F64ToF32Bits(x)))
LOADSTONE_CAST_OP(E4M3ToF32, uint8_t, uint32_t, cv::F8E4M3ToF32Bits(x))
LOADSTONE_CAST_OP(E4M3ToF16, uint8_t, uint16_t, cv::F8E4M3ToF16Bits(x))
LOADSTONE_CAST_OP(E4M3ToBF16, uint8_t, uint16_t, cv::F8E4M3ToBF16Bits(x))
LOADSTONE_CAST_OP(E5M2ToF32, uint8_t, uint32_t, cv::F8E5M2ToF32Bits(x))
LOADSTONE_CAST_OP(E5M2ToF16, uint8_t, uint16_t, cv::F8E5M2ToF16Bits(x))
LOADSTONE_CAST_OP(E5M2ToBF16, uint8_t, uint16_t, cv::F8E5M2ToBF16Bits(x))
#undef LOADSTONE_CAST_OP

template <typename T, int N, int Align>
struct alignas(Align) Vec {
  T v[N];
};

template <typename Op>
struct VecTypes {
  static constexpr int kN = 16 / sizeof(typename Op::In);
  static constexpr int kOutAlign = std::min<int>(16, kN * sizeof(typename Op::Out));
  using In = Vec<typename Op::In, kN, 16>;
  using Out = Vec<typename Op::Out, kN, kOutAlign>;
};

__device__ __forceinline__ uint64_t GlobalThread() {
  return uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridStride() { return uint64_t{gridDim.x} * blockDim.x; }

// REQUIRES: src 16-byte aligned, dst aligned to VecTypes<Op>::kOutAlign.
template <typename Op>
__global__ void CastVectors(const std::byte* __restrict__ src, std::byte* __restrict__ dst,
                            uint64_t vectors) {
  using V = VecTypes<Op>;
  const auto* in = reinterpret_cast<const typename V::In*>(src);
  auto* out = reinterpret_cast<typename V::Out*>(dst);
  const Op op;
  for (uint64_t i = GlobalThread(); i < vectors; i += GridStride()) {
    const typename V::In x = in[i];
    typename V::Out y;
#pragma unroll
    for (int k = 0; k < V::kN; ++k) y.v[k] = op(x.v[k]);
    out[i] = y;
  }
}

// One element per step. kAligned: both pointers aligned to their element size (typed loads);
// otherwise byte-wise copies through memcpy.
template <typename Op, bool kAligned>
__global__ void CastElements(const std::byte* __restrict__ src, std::byte* __restrict__ dst,
                             uint64_t count) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const Op op;
  for (uint64_t i = GlobalThread(); i < count; i += GridStride()) {
    if constexpr (kAligned) {
      reinterpret_cast<Out*>(dst)[i] = op(reinterpret_cast<const In*>(src)[i]);
    } else {
      In x;
      memcpy(&x, src + i * sizeof(In), sizeof(In));
      const Out y = op(x);
      memcpy(dst + i * sizeof(Out), &y, sizeof(Out));
    }
  }
}

template <typename Op>
void Enqueue(const std::byte* src, std::byte* dst, uint64_t count, cudaStream_t stream,
             uint32_t sm_count) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const CastGeometry g = PlanCast(count, sizeof(In), sizeof(Out), reinterpret_cast<uint64_t>(src),
                                  reinterpret_cast<uint64_t>(dst), sm_count);
  if (g.blocks == 0) return;
  uint64_t done = 0;
  if (g.vectorized) {
    CastVectors<Op><<<g.blocks, g.threads, 0, stream>>>(src, dst, g.vectors);
    done = g.vectors * g.vector_elems;
  }
  if (g.tail == 0) return;
  const std::byte* s = src + done * sizeof(In);
  std::byte* d = dst + done * sizeof(Out);
  const uint32_t blocks =
      g.vectorized ? 1 : g.blocks;  // a vector tail is < 16 elements: one block
  const bool aligned = reinterpret_cast<uint64_t>(s) % sizeof(In) == 0 &&
                       reinterpret_cast<uint64_t>(d) % sizeof(Out) == 0;
  if (aligned) {
    CastElements<Op, true><<<blocks, g.threads, 0, stream>>>(s, d, g.tail);
  } else {
    CastElements<Op, false><<<blocks, g.threads, 0, stream>>>(s, d, g.tail);
  }
}

using EnqueueFn = void (*)(const std::byte*, std::byte*, uint64_t, cudaStream_t, uint32_t);

EnqueueFn Find(DType from, DType to) {
  switch (from) {
    case DType::kF32:
      return to == DType::kBF16 ? Enqueue<F32ToBF16> : to == DType::kF16 ? Enqueue<F32ToF16>
                                                                          : nullptr;
    case DType::kBF16:
      return to == DType::kF32 ? Enqueue<BF16ToF32> : to == DType::kF16 ? Enqueue<BF16ToF16>
                                                                         : nullptr;
    case DType::kF16:
      return to == DType::kF32 ? Enqueue<F16ToF32> : to == DType::kBF16 ? Enqueue<F16ToBF16>
                                                                         : nullptr;
    case DType::kF64:
      return to == DType::kF32    ? Enqueue<F64ToF32>
             : to == DType::kF16  ? Enqueue<F64ToF16>
             : to == DType::kBF16 ? Enqueue<F64ToBF16>
                                  : nullptr;
    case DType::kF8E4M3:
      return to == DType::kF32    ? Enqueue<E4M3ToF32>
             : to == DType::kF16  ? Enqueue<E4M3ToF16>
             : to == DType::kBF16 ? Enqueue<E4M3ToBF16>
                                  : nullptr;
    case DType::kF8E5M2:
      return to == DType::kF32    ? Enqueue<E5M2ToF32>
             : to == DType::kF16  ? Enqueue<E5M2ToF16>
             : to == DType::kBF16 ? Enqueue<E5M2ToBF16>
                                  : nullptr;
    default:
      return nullptr;
  }
}

// Block-scaled float8 dequant: the encoders of the targets, as functors (device code cannot
// take a host function's address as a template argument).
struct EncodeF32 {
  using Out = uint32_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return f; }
};
struct EncodeF16 {
  using Out = uint16_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return cv::F32ToF16Bits(f); }
};
struct EncodeBF16 {
  using Out = uint16_t;
  __device__ __forceinline__ Out operator()(uint32_t f) const { return cv::F32ToBF16Bits(f); }
};

// One element per step; Index is uint32_t when first + count fits (cheaper divisions).
template <bool kE5M2, typename Encode, typename Index>
__global__ void DequantFp8Elements(const uint8_t* __restrict__ src, std::byte* __restrict__ dst,
                                   uint64_t first, uint64_t count,
                                   const std::byte* __restrict__ scales, DType scale_dtype,
                                   Index cols, Index block_rows, Index block_cols,
                                   Index scale_cols) {
  using Out = typename Encode::Out;
  const Encode encode;
  const uint32_t scale_bytes = scale_dtype == DType::kF32 ? 4 : 2;
  for (uint64_t i = GlobalThread(); i < count; i += GridStride()) {
    const auto e = static_cast<Index>(first + i);
    const Index row = e / cols, col = e % cols;
    uint32_t raw = 0;
    memcpy(&raw, scales + (uint64_t{row / block_rows} * scale_cols + col / block_cols) * scale_bytes,
           scale_bytes);
    const uint32_t scale = cv::Fp8ScaleToF32Bits(raw, scale_dtype);
    const Out y = encode(cv::Fp8ScaledF32Bits(src[i], kE5M2, scale, scale_dtype));
    memcpy(dst + i * sizeof(Out), &y, sizeof(Out));
  }
}

template <bool kE5M2, typename Encode>
void EnqueueDequant(const std::byte* src, std::byte* dst, uint64_t first, uint64_t count,
                    const cv::Fp8BlockScales& l, cudaStream_t stream, uint32_t sm_count) {
  // One element per thread step (odd addresses ask PlanCast for its scalar geometry).
  const CastGeometry g = PlanCast(count, 1, sizeof(typename Encode::Out), 1, 1, sm_count);
  if (g.blocks == 0) return;
  const auto* codes = reinterpret_cast<const uint8_t*>(src);
  if (first + count <= UINT32_MAX) {
    DequantFp8Elements<kE5M2, Encode, uint32_t><<<g.blocks, g.threads, 0, stream>>>(
        codes, dst, first, count, l.scales, l.scale_dtype, static_cast<uint32_t>(l.cols),
        static_cast<uint32_t>(l.block_rows), static_cast<uint32_t>(l.block_cols),
        static_cast<uint32_t>(l.scale_cols));
  } else {
    DequantFp8Elements<kE5M2, Encode, uint64_t><<<g.blocks, g.threads, 0, stream>>>(
        codes, dst, first, count, l.scales, l.scale_dtype, l.cols, l.block_rows, l.block_cols,
        l.scale_cols);
  }
}

using EnqueueDequantFn = void (*)(const std::byte*, std::byte*, uint64_t, uint64_t,
                                  const cv::Fp8BlockScales&, cudaStream_t, uint32_t);

template <bool kE5M2>
EnqueueDequantFn FindDequant(DType to) {
  switch (to) {
    case DType::kF32: return EnqueueDequant<kE5M2, EncodeF32>;
    case DType::kF16: return EnqueueDequant<kE5M2, EncodeF16>;
    case DType::kBF16: return EnqueueDequant<kE5M2, EncodeBF16>;
    default: return nullptr;
  }
}

EnqueueDequantFn FindDequant(DType from, DType to) {
  if (from == DType::kF8E4M3) return FindDequant<false>(to);
  if (from == DType::kF8E5M2) return FindDequant<true>(to);
  return nullptr;
}

}  // namespace

bool CanCastOnDevice(DType from, DType to) { return Find(from, to) != nullptr; }

Status LaunchCast(DType from, DType to, const std::byte* src, std::byte* dst, uint64_t count,
                  void* stream, uint32_t sm_count, int device) {
  const EnqueueFn fn = Find(from, to);
  const std::string what =
      "cast kernel " + std::string(TorchName(from)) + "->" + std::string(TorchName(to));
  if (fn == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": no " + what +
                                   ": only float32/float16/bfloat16/float64/float8_e4m3fn/"
                                   "float8_e5m2 convert, and only to float32/float16/bfloat16");
  }
  if (count == 0) return Status::OK();
  if (src == nullptr || dst == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  fn(src, dst, count, static_cast<cudaStream_t>(stream), sm_count);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::OK()
                            : CudaErrorStatus(static_cast<int>(err), {what, device});
}

bool CanDequantFp8BlockOnDevice(DType from, DType to) { return FindDequant(from, to) != nullptr; }

Status LaunchDequantFp8Block(DType from, DType to, const std::byte* src, std::byte* dst,
                             uint64_t first, uint64_t count, const convert::Fp8BlockScales& layout,
                             void* stream, uint32_t sm_count, int device) {
  const EnqueueDequantFn fn = FindDequant(from, to);
  const std::string what = "fp8 block dequant kernel " + std::string(TorchName(from)) + "->" +
                           std::string(TorchName(to));
  if (fn == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": no " + what +
                                   ": only float8_e4m3fn/float8_e5m2 to float32/float16/bfloat16");
  }
  if (layout.cols == 0 || layout.block_rows == 0 || layout.block_cols == 0 ||
      layout.scale_cols != (layout.cols + layout.block_cols - 1) / layout.block_cols ||
      !cv::IsFp8ScaleDType(layout.scale_dtype)) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a bad block layout");
  }
  if (count == 0) return Status::OK();
  if (src == nullptr || dst == nullptr || layout.scales == nullptr) {
    return Status::InvalidArgument(DeviceName(device) + ": " + what + " with a null pointer");
  }
  fn(src, dst, first, count, layout, static_cast<cudaStream_t>(stream), sm_count);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::OK()
                            : CudaErrorStatus(static_cast<int>(err), {what, device});
}

}  // namespace loadstone::cuda
