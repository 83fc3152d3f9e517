// How a cast kernel is launched: how many elements each thread converts per step (a vector
// of one 16-byte load), whether the pointers allow the vector path, and the grid. Pure
// arithmetic, no CUDA types, so that it is tested on the CPU.
#ifndef LOADSTONE_CUDA_LAUNCH_GEOMETRY_H_
#define LOADSTONE_CUDA_LAUNCH_GEOMETRY_H_

#include <algorithm>
#include <cstdint>

namespace loadstone::cuda {

inline constexpr int kCastThreads = 256;       // per block
inline constexpr int kCastBlocksPerSm = 8;     // enough resident warps to cover DRAM latency
inline constexpr uint32_t kMaxGridX = 0x7FFFFFFFu;

struct CastGeometry {
  bool vectorized = false;   // the 16-byte-load kernel; otherwise one element per thread step
  uint32_t vector_elems = 1; // elements per vector (16 / input element size) when vectorized
  uint64_t vectors = 0;      // whole vectors (vectorized) — the rest is the tail
  uint64_t tail = 0;         // elements after the last whole vector (scalar kernel)
  uint32_t blocks = 0;       // grid size (0: nothing to launch)
  uint32_t threads = kCastThreads;
};

// in_bytes/out_bytes: element sizes (1, 2, 4 or 8). src/dst: the addresses as integers.
// The vector path needs src 16-byte aligned and dst aligned to its vector's store size
// (vector_elems * out_bytes, at most 16): true for device scratch and for tensors that
// start at aligned offsets; anything else takes the scalar path, which is still coalesced.
// sm_count: multiprocessors of the device (>= 1); the grid is capped at kCastBlocksPerSm per
// multiprocessor and the kernels loop (grid-stride) over the rest.
constexpr CastGeometry PlanCast(uint64_t count, uint32_t in_bytes, uint32_t out_bytes,
                                uint64_t src, uint64_t dst, uint32_t sm_count) {
  CastGeometry g;
  if (count == 0 || in_bytes == 0 || out_bytes == 0) return g;
  const uint32_t elems = 16 / in_bytes;
  const uint64_t store = std::min<uint64_t>(16, uint64_t{elems} * out_bytes);
  g.vectorized = elems > 1 && src % 16 == 0 && dst % store == 0 && count >= elems;
  uint64_t work = count;
  if (g.vectorized) {
    g.vector_elems = elems;
    g.vectors = count / elems;
    g.tail = count % elems;
    work = g.vectors;
  } else {
    g.tail = count;
  }
  const uint64_t needed = (work + kCastThreads - 1) / kCastThreads;
  const uint64_t cap = uint64_t{std::max<uint32_t>(sm_count, 1)} * kCastBlocksPerSm;
  g.blocks = static_cast<uint32_t>(std::min<uint64_t>({needed, cap, kMaxGridX}));
  return g;
}

}  // namespace loadstone::cuda

#endif  // LOADSTONE_CUDA_LAUNCH_GEOMETRY_H_
