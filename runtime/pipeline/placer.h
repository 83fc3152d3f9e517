// What a staged chunk's bytes become, for one load: each CPU piece written into its tensor as
// planned (a copy, a cast, a float8 block dequantization; into fresh pages through FreshPages,
// Destinations::Fresh), and each device piece described as a device job. It reads the plan, the
// catalog and the memory it is given, and keeps no state of its own: the workers call Place, the
// event loop DeviceJob (the placement stage, placement_stage.h, does the posting, the counting
// and the waiting for scales).
#ifndef LOADSTONE_RUNTIME_PIPELINE_PLACER_H_
#define LOADSTONE_RUNTIME_PIPELINE_PLACER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/plan.h"
#include "runtime/convert/fp8_block.h"
#include "runtime/device/accelerator.h"
#include "runtime/pipeline/destinations.h"

namespace loadstone::pipeline {

// The file range [lo, hi) of tensor `src` that `read` holds.
inline std::pair<uint64_t, uint64_t> PieceOf(const ReadChunk& read, const TensorInfo& src) {
  return {std::max(read.offset, src.offset),
          std::min(read.offset + read.length, src.offset + src.nbytes)};
}

class Placer {
 public:
  Placer(const Checkpoint& checkpoint, const LoadPlan& plan, const Destinations& destinations)
      : checkpoint_(checkpoint), plan_(plan), destinations_(destinations) {}

  // Writes the piece [lo, hi) of tensor `t`'s file bytes, at `from`, into its memory `data`,
  // converted as planned; `scales`: the memory of its float8 scales (kDequantFp8Block) or of its
  // absmax (kDequantBnb4).
  Status PlaceOnCpu(uint32_t t, std::byte* data, const std::byte* scales, const std::byte* from,
                    uint64_t lo, uint64_t hi) const;
  // The whole of a shared-buffer read (ReadChunk::shared_buffer), `staged`, into `buffer`.
  Status PlaceShared(const ReadChunk& read, std::byte* buffer, const std::byte* staged) const;
  // The job that puts tensor `t`'s piece of `read` (staged at `staged`) into its device memory
  // `data`; its callbacks are the caller's to set. REQUIRES: `t`'s file layout is plain.
  device::PlaceJob DeviceJob(const ReadChunk& read, uint32_t t, std::byte* data,
                             const std::byte* scales, const std::byte* staged) const;
  // The same for the piece [lo, hi) of a contiguous little-endian tensor at `from`: what
  // Relayout made of a strided or big-endian one (lo: where the piece's file bytes start, hi:
  // lo plus the bytes Relayout made).
  // The job that has a device decode quantized tensor `t`'s piece of staged read `read` (its
  // bytes at `staged`) into memory `data`, with `quant` (Accelerator::DecodesQuantized).
  Result<device::PlaceJob> QuantJob(const ReadChunk& read, uint32_t t, std::byte* data,
                                    const std::byte* staged,
                                    std::shared_ptr<const device::QuantDecode> quant) const;
  device::PlaceJob DeviceJobFrom(uint32_t t, std::byte* data, const std::byte* scales,
                                 const std::byte* from, uint64_t lo, uint64_t hi) const;
  // The file bytes [lo, hi) of tensor `t` (a strided one whole, a big-endian one in whole
  // elements) at `from`, in C order and little-endian, into `plain`.
  Status Relayout(uint32_t t, const std::byte* from, uint64_t lo, uint64_t hi,
                  std::vector<std::byte>* plain) const;
  // The file bytes [lo, hi) of packed tensor `t` at `from` (kDequantBlocks: whole blocks;
  // kDequantBnb4/8: any bytes, `scales` its absmax or SCB in host memory), decoded into `out`
  // (what a device then copies: DequantizedJob). Errors: InvalidArgument for a piece that cuts a
  // block.
  Status Dequantize(uint32_t t, const std::byte* scales, const std::byte* from, uint64_t lo,
                    uint64_t hi, std::vector<std::byte>* out) const;
  // The copy of `decoded` (Dequantize of the piece starting at file byte `lo`) into the device
  // memory `data` of tensor `t`.
  device::PlaceJob DequantizedJob(uint32_t t, std::byte* data, const std::vector<std::byte>& decoded,
                                  uint64_t lo) const;
  // The block layout of dequantized tensor `t`, its scales in place at `scales`.
  convert::Fp8BlockScales Fp8Layout(uint32_t t, const std::byte* scales) const;

 private:
  // Where the piece [lo, hi) of kDequantBlocks tensor `t` sits: its first block, how many, and
  // the bytes of one block in the file and once decoded.
  struct Blocks {
    uint64_t first = 0, count = 0, in_bytes = 0, out_bytes = 0;
  };
  Result<Blocks> BlocksOf(uint32_t t, uint64_t lo, uint64_t hi) const;
  // The elements [first, first + count) of tensor `t` (DecodesWithState) that its file bytes
  // [lo, hi) hold (a piece starts at a byte: its first element is even for 4-bit codes; at a
  // word for compressed-tensors).
  std::pair<uint64_t, uint64_t> ElementsOf(uint32_t t, uint64_t lo, uint64_t hi) const;
  // Decodes elements [e, e + n) of tensor `t` (DecodesWithState) into `out`: `piece` holds its
  // file bytes from element `piece_first` on, `scales` its absmax, SCB or weight_scale.
  Status DecodeElements(uint32_t t, const std::byte* scales, const std::byte* piece,
                   uint64_t piece_first, uint64_t e, uint64_t n, std::byte* out) const;

  const Checkpoint& checkpoint_;
  const LoadPlan& plan_;
  const Destinations& destinations_;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_PLACER_H_
