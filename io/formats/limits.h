// Every bound a file from a stranger meets before loadstone allocates for what it says, in one
// place. A file past one is refused with an error naming the bound (its name here), the file and
// the byte where it was found; a file inside them all costs at most what each line says
// (docs/reliability.md, "Resource bounds", lists them with their errors and tests). Each is far
// above what the producers write (the comments say what they write), and checked before the
// allocation it bounds (a count growing one by one, as a pickle's stack: as it passes it).
#ifndef LOADSTONE_IO_FORMATS_LIMITS_H_
#define LOADSTONE_IO_FORMATS_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loadstone/status.h"

namespace loadstone::io {

// --- Every format ---
// Tensors one file may list (the largest seen: 100k, a 100k-tensor benchmark file; a Llama
// shard holds ~300). Catalog memory ~200 bytes a tensor plus its name.
inline constexpr uint64_t kMaxTensorsPerFile = 1 << 20;
// A tensor's name, in bytes (the longest Hugging Face names are ~100).
inline constexpr size_t kMaxTensorNameBytes = 4096;
// A tensor's dimensions (PyTorch's own practical limit, TensorIterator's 64).
inline constexpr size_t kMaxTensorRank = 64;

// --- safetensors ---
// The header's length (the reference implementation's own limit, N_MAX).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
// JSON nesting inside it (serde_json's recursion limit, which the reference inherits).
inline constexpr int kSafetensorsMaxDepth = 127;

// --- PyTorch .bin (a zip holding a pickle) ---
// The zip's central directory (100k storages take ~8 MB) and its entries (one per storage).
inline constexpr uint64_t kZipMaxCentralDirectory = 256ULL << 20;
inline constexpr uint64_t kZipMaxEntries = 1 << 21;
// data.pkl, read whole (a 100k-tensor state dict takes 10 MB), and the byteorder entry ("little").
inline constexpr uint64_t kTorchMaxPickle = 64ULL << 20;
inline constexpr uint64_t kTorchMaxByteorder = 16;
// The unpickler's stack, memo and open MARKs (torch.save's pickles: a stack of a few thousand,
// ~10 memo entries a tensor, MARKs a few deep).
inline constexpr size_t kPickleMaxStack = 1 << 20;
inline constexpr size_t kPickleMaxMemo = 1 << 22;
inline constexpr size_t kPickleMaxMarks = 4096;
// Values a pickle of `bytes` may build, and items or bytes it may copy or hash (torch.save:
// ~0.12 values a byte): a multiple of its size, so that no stream makes work beyond it.
inline constexpr uint64_t PickleMaxValues(uint64_t bytes) { return 1'000'000 + bytes / 4; }
inline constexpr uint64_t PickleMaxCopies(uint64_t bytes) { return 4'000'000 + 4 * bytes; }

// --- GGUF ---
// Metadata key-values (llama.cpp writes ~40), one string value (chat templates take ~10 KB;
// an embedded tokenizer.json a few MB), array elements (vocabularies: ~256k), and the metadata
// text kept in all (arrays keep their first kGgufArrayShown elements).
inline constexpr uint64_t kGgufMaxKeys = 1 << 16;
inline constexpr uint64_t kGgufMaxString = 64ULL << 20;
inline constexpr uint64_t kGgufMaxArray = 1 << 24;
inline constexpr uint64_t kGgufMaxMetadataBytes = 256ULL << 20;
// The format's own: a key's length (the GGUF spec: at most 2^16 - 1 bytes), GGML_MAX_NAME
// (with its NUL) and GGML_MAX_DIMS.
inline constexpr uint64_t kGgufMaxKey = 65535;
inline constexpr size_t kGgufMaxName = 64;
inline constexpr uint32_t kGgufMaxDims = 4;

// --- JSON documents beside the weights, read whole ---
// Nesting, checked on the text before any value is built (so that nothing recurses deeper).
inline constexpr int kMaxJsonDepth = 256;
inline constexpr uint64_t kMaxConfigBytes = 16ULL << 20;         // config.json
inline constexpr uint64_t kMaxQuantizeConfigBytes = 1ULL << 20;  // quantize_config.json
inline constexpr uint64_t kMaxShardIndexBytes = 256ULL << 20;    // *.index.json
inline constexpr uint64_t kMaxOffloadIndexBytes = 256ULL << 20;  // an offload folder's index.json
inline constexpr uint64_t kMaxModelDescriptionBytes = 256ULL << 20;  // --model JSON (~10 MB)

// --- Quantization states, read at Open ---
inline constexpr uint64_t kMaxQuantStateJsonBytes = 64 << 10;  // bitsandbytes' JSON (~150 B)
inline constexpr uint64_t kMaxNestedAbsmaxBytes = 16 << 20;    // its nested absmax table
// A GPTQ/AWQ/compressed-tensors table read at Open (g_idx, zeros): a 70B layer's take ~1 MB.
inline constexpr uint64_t kMaxPackedIntTableBytes = 16 << 20;

// The refusal of a file past one of these bounds: Unsupported, "`where`: `what` is beyond
// `bound` (= `value`) ...", saying that the bound is loadstone's, not the format's.
Status BeyondBound(std::string_view where, std::string_view what, std::string_view bound,
                   uint64_t value);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_LIMITS_H_
