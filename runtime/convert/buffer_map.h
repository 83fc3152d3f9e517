// The element loop shared by the CPU conversions (cast.cc, fp8_block.cc): unaligned loads and
// stores through memcpy, one function per element, and per-CPU clones of each loop.
#ifndef LOADSTONE_RUNTIME_CONVERT_BUFFER_MAP_H_
#define LOADSTONE_RUNTIME_CONVERT_BUFFER_MAP_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loadstone::convert {

// Each kernel is compiled for baseline x86-64 (SSE2), x86-64-v3 (AVX2) and x86-64-v4
// (AVX-512); the loader picks the best one the CPU runs once, at program start (an ifunc).
// Not under ThreadSanitizer: its instrumented ifunc resolvers run before its runtime is up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define LOADSTONE_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LOADSTONE_CLONES
#endif

// Applies `fn` to each element. Loads and stores go through memcpy, so neither pointer needs
// alignment; GCC turns the loop into vector code (it checks src/dst overlap once at run time).
template <typename In, typename Out, typename Fn>
inline void Map(const std::byte* src, std::byte* dst, uint64_t count, Fn fn) {
  for (uint64_t i = 0; i < count; ++i) {
    In x;
    std::memcpy(&x, src + i * sizeof(In), sizeof(In));
    const Out y = fn(x);
    std::memcpy(dst + i * sizeof(Out), &y, sizeof(Out));
  }
}

}  // namespace loadstone::convert

#endif  // LOADSTONE_RUNTIME_CONVERT_BUFFER_MAP_H_
