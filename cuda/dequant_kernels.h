// Dequantization on the GPU, bit-exact with runtime/convert's CPU references: the kernels apply
// the very per-element rules of runtime/convert/dequant_element.h (shared with DequantPackedInt,
// DequantBnb4 and DequantBnbInt8) and the block decoders of gguf_block_decode.h (shared with
// DequantGgufBlocks), and encode with float_bits.h, as the cast kernels do. One thread per
// output element (GGUF: per block), grid-stride; every table a kernel indexes is a device
// address in the structs below.
//
// CudaDevice runs them for quantized PlaceJobs (LaunchQuantJob): a GPU target's quantized
// weights are copied packed and decoded on the device. Tested against the CPU references by
// tests/gpu/dequant_kernels_test.cc (label gpu). Compiled, not yet run on a GPU.
#ifndef LOADSTONE_CUDA_DEQUANT_KERNELS_H_
#define LOADSTONE_CUDA_DEQUANT_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loadstone/checkpoint.h"
#include "loadstone/dtype.h"
#include "loadstone/status.h"
#include "runtime/device/accelerator.h"

namespace loadstone::cuda {

// A PackedIntState with its tables at device addresses.
struct DevicePackedInt {
  uint32_t bits = 4;
  PackOrder order = PackOrder::kRows;
  uint64_t rows = 0, cols = 0, groups = 1, group_size = 0;
  DType scale_dtype = DType::kBF16;
  const int16_t* zeros = nullptr;  // rows x groups; nullptr: 2^(bits-1) for all
  const int32_t* g_idx = nullptr;  // cols; nullptr: c / group_size
};

// A Bnb4State with its tables at device addresses (the 16 codes travel by value).
struct DeviceBnb4 {
  bool fp4 = false;
  float code[16] = {};
  uint64_t blocksize = 0;  // elements per absmax
  bool nested = false;
  uint32_t nested_blocksize = 0;
  float nested_offset = 0;
  const float* nested_code = nullptr;    // 256
  const float* nested_absmax = nullptr;  // one per nested block
};

// The kernels' view of `state` with its zeros and g_idx at device addresses (null when the
// state has none), and of a bitsandbytes 4-bit `layout` (PackedLayout::bnb4 set) with its nested
// tables at device addresses (null when not nested).
DevicePackedInt DeviceStateOf(const PackedIntState& state, const int16_t* zeros,
                              const int32_t* g_idx);
DeviceBnb4 DeviceStateOf(const PackedLayout& layout, const float* nested_code,
                         const float* nested_absmax);

// True when the kernels below decode into `to`: f32, f16 or bf16 (convert::CanDequantBnb4).
bool CanDequantOnDevice(DType to);

// Each enqueues on `stream` (a cudaStream_t; nullptr = the legacy default stream) of the
// current device the decode of elements [first, first + count) (row-major over the element
// shape) into `count` elements of `to` at `dst`, with the arguments of its CPU reference, all
// device addresses. Returns at once. Errors: InvalidArgument for a target other than f32, f16
// or bf16, a state the reference would refuse, or a null pointer; a launch error as its Status.
// sm_count: the device's multiprocessor count (the grid depends on it).
//
// convert::DequantPackedInt: `words` from word `first_word` on; `scales` the whole tensor.
Status LaunchDequantPackedInt(const DevicePackedInt& state, DType to, const std::byte* words,
                              uint64_t first_word, uint64_t first, uint64_t count,
                              const std::byte* scales, std::byte* dst, void* stream,
                              uint32_t sm_count, int device);
// convert::DequantBnb4: `packed` the byte holding element `first`; `absmax` the whole tensor.
Status LaunchDequantBnb4(const DeviceBnb4& state, DType to, const std::byte* packed, uint64_t first,
                         uint64_t count, const std::byte* absmax, std::byte* dst, void* stream,
                         uint32_t sm_count, int device);
// convert::DequantBnbInt8: `codes` those elements' int8 codes; `scb` the whole row absmax.
Status LaunchDequantBnbInt8(DType to, const std::byte* codes, uint64_t first, uint64_t count,
                            uint64_t cols, const std::byte* scb, std::byte* dst, void* stream,
                            uint32_t sm_count, int device);

// convert::DequantGgufBlocks: `blocks` whole blocks of `scheme` ("Q4_0" ... "Q6_K") at `src`,
// one block a thread step.
Status LaunchDequantGgufBlocks(std::string_view scheme, DType to, const std::byte* src,
                               std::byte* dst, uint64_t blocks, void* stream, uint32_t sm_count,
                               int device);

// The kernel a quantized PlaceJob (PlaceJob::quant) asks for, reading the job's packed bytes
// from `src` (device scratch holding job.bytes) and its quant state from job.quant's device
// addresses, writing job.dst. Errors as the launchers'.
Status LaunchQuantJob(const device::PlaceJob& job, const std::byte* src, void* stream,
                      uint32_t sm_count, int device);

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_DEQUANT_KERNELS_H_
