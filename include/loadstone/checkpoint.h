// Checkpoint: the catalog of every tensor of a model, built from headers only.
//
//   auto ckpt = loadstone::Checkpoint::Open("models/llama");   // a file, a folder or an index
//   if (!ckpt.ok()) { std::cerr << ckpt.status() << "\n"; return 1; }
//   for (const loadstone::TensorInfo& t : ckpt->tensors()) ...
//
// Open reads and validates headers (and the shard index) and never a data byte. Shards stay
// separate files: nothing is merged or copied.
//
// Thread safety: a Checkpoint is immutable after Open; copies are cheap (shared state) and may
// be used from any number of threads.
#ifndef LOADSTONE_CHECKPOINT_H_
#define LOADSTONE_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstone/dtype.h"
#include "loadstone/status.h"

namespace loadstone {

enum class CheckpointFormat {
  kSafetensors,
  kPyTorch,  // torch.save zip archives (.bin, .pt, .pth): docs/formats.md
  kGguf,     // llama.cpp's GGUF, one file or a split set: docs/formats.md
  // accelerate's offload folder (index.json + NAME.dat, or references into safetensors files):
  // what a disk offload wrote (offload.h), opened to read those tensors back.
  kOffloadFolder,
};

// "safetensors", "pytorch", "gguf", "offload-folder".
std::string_view CheckpointFormatName(CheckpointFormat format);

// Which file a path named when its header was read, and when it was last written: a load
// opens its files again and refuses one that is no longer that file (replaced, rewritten,
// truncated), instead of reading bytes the catalog does not describe. A rewrite within the same
// tick of the file system's clock as the Open (1-10 ms on kernels before 6.13) keeps the
// modification time and is not seen. Zero: not known (a catalog built by hand); the load then
// only checks the size.
struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t mtime_sec = 0;  // last modification (st_mtim)
  int64_t mtime_nsec = 0;
  // A remote object's version as its server names it (its ETag, else its Last-Modified); empty
  // for a local file.
  std::string validator;
  bool known() const { return inode != 0; }
  bool SameFile(const FileStamp& other) const {
    return device == other.device && inode == other.inode;
  }
  bool operator==(const FileStamp&) const = default;
};

struct CheckpointFile {
  std::string path;    // as opened (absolute if the caller gave an absolute path)
  uint64_t bytes = 0;  // file size when the header was read
  FileStamp stamp;     // the file then
};

// A bitsandbytes 4-bit weight's quant state (docs/conversions.md, "bitsandbytes 4-bit"), read
// at Open from the tensors transformers saves beside the packed weight `W`: the JSON of
// `W.quant_state.bitsandbytes__nf4|fp4`, `W.quant_map` and, when nested, `W.nested_quant_map` and
// `W.nested_absmax` (small: 16 + 256 values and one per 256 blocks). The per-block absmax
// `W.absmax` is a tensor of the load: the plan reads it before the weight.
struct Bnb4State {
  bool fp4 = false;                   // quant_type "fp4"; else "nf4"
  std::array<float, 16> code{};       // W.quant_map, the value of each nibble
  DType dtype = DType::kBF16;         // the weight's dtype before quantization
  std::string absmax;                 // W.absmax: f32 per block, or u8 codes when nested
  bool nested = false;                // absmax_b = nested_code[u8[b]] * nested_absmax[b / nb] + offset
  uint32_t nested_blocksize = 0;      // nb
  float nested_offset = 0;
  std::array<float, 256> nested_code{};   // W.nested_quant_map
  std::vector<float> nested_absmax;       // W.nested_absmax
  // Every tensor of the state (absmax first, then quant_map, the nested ones, the JSON): loaded
  // as stored, never cast.
  std::vector<std::string> companions;
};

// A bitsandbytes LLM.int8 weight `M.weight` (I8 [out, in]): its row absmax `M.SCB` (f32 [out], a
// sibling of the weight) and `M.weight_format` (u8 scalar; 0 = "row", the only layout loadstone
// dequantizes), read at Open.
struct BnbInt8State {
  std::string scb;           // M.SCB
  uint8_t weight_format = 0;  // 0 when the checkpoint has no M.weight_format
  std::vector<std::string> companions;  // M.SCB, then M.weight_format when present
};

// How the words of a packed-integer weight hold its codes (docs/conversions.md).
enum class PackOrder : uint8_t {
  // compressed-tensors `M.weight_packed` int32 [out, ceil(in * bits / 32)]: along the input dim.
  kRows,
  // GPTQ `M.qweight` int32 [in * bits / 32, out]: each column of words holds one output's codes
  // along the input dim, LSB first, as one bit stream per column (3-bit codes straddle words).
  kGptq,
  // AWQ (GEMM) `M.qweight` int32 [in, out / 8]: along the output dim, output 8c + k in nibble
  // [0, 4, 1, 5, 2, 6, 3, 7][k] of word c.
  kAwq,
};

// A weight of `bits`-bit integer codes packed into int32 words, decoded W[r][c] = (q - zero[r][g])
// * scale[r][g], g = g_idx[c] (or c / group_size), computed in f32 and rounded to the scale's
// dtype, as the producers do; r is the output row, c the input column. Three producers write it:
// - compressed-tensors `pack-quantized` `M.weight_packed` (PackOrder::kRows): codes stored
//   + 2^(bits-1); `M.weight_scale` [out, groups]; `M.weight_shape`, the zero points
//   `M.weight_zero_point` (packed along the output dim) and `M.weight_g_idx`, read at Open.
// - GPTQ `M.qweight` (kGptq): `M.scales` [groups, out]; `M.qzeros` (packed like the codes, along
//   out; v1 checkpoints store zero - 1) and `M.g_idx`, read at Open.
// - AWQ GEMM `M.qweight` (kAwq): `M.scales` [groups, out]; `M.qzeros` (packed as the codes),
//   read at Open.
// The scales (f32/bf16/f16: the output's dtype) are loaded with the weight. The GPTQ and AWQ
// layouts hold an output row's codes across the whole tensor, so such a weight is read whole.
struct PackedIntState {
  uint32_t bits = 4;          // 2, 4 or 8; 3 for GPTQ
  PackOrder order = PackOrder::kRows;
  uint64_t rows = 0;          // out
  uint64_t cols = 0;          // in
  uint64_t groups = 1;        // scales per row
  uint64_t group_size = 0;    // columns a scale covers without g_idx (ceil(cols / groups))
  DType scale_dtype = DType::kBF16;
  // The code that decodes to 0 for row r, group g, at [r * groups + g]; empty: 2^(bits-1) for
  // all (a symmetric compressed-tensors weight).
  std::vector<int16_t> zeros;
  std::vector<int32_t> g_idx;  // the group of each column; empty: c / group_size
  // The scales first (M.weight_scale, M.scales), then the tensors read at Open, as present.
  std::vector<std::string> companions;

  // True when an output row's codes are spread over the whole tensor (GPTQ, AWQ): read whole.
  bool transposed() const { return order != PackOrder::kRows; }
  // int32 words the weight has.
  uint64_t words() const;
};

// How a block-quantized tensor is stored when it is cataloged packed (a GGUF Q4_K, a bitsandbytes
// nf4 weight, ...): the TensorInfo then has the dtype and shape of its bytes as the file stores
// them (GGUF: U8, the last dimension in bytes, whole blocks; bitsandbytes: [ceil(n / 2), 1] of
// its quant_storage dtype, two 4-bit codes a byte), and this says what those bytes are.
struct PackedLayout {
  // The producer's name for it: "Q4_0", "Q4_K", ... (GGUF); "bnb-nf4", "bnb-fp4", "bnb-int8"
  // (bitsandbytes; an int8 weight's bytes are its elements, its shape its element shape);
  // "ct-int4" (and ct-int2, ct-int8: compressed-tensors pack-quantized); "gptq-int4" (GPTQ v1;
  // "gptq_v2-int4" for v2; 2, 3 and 8 bits too) and "awq-int4".
  std::string scheme;
  std::vector<uint64_t> element_shape;  // its shape in elements, PyTorch order
  uint32_t block_elems = 0;            // elements per block (bitsandbytes: per absmax)
  uint32_t block_bytes = 0;            // bytes per block (bitsandbytes: the last may be partial)
  std::shared_ptr<const Bnb4State> bnb4;      // set for "bnb-nf4" and "bnb-fp4"
  std::shared_ptr<const BnbInt8State> bnb8;   // set for "bnb-int8"
  std::shared_ptr<const PackedIntState> packed_int;  // set for "ct-*", "gptq*", "awq-*"
  // The name the weight has once dequantized, when not its own ("M.weight" for compressed-tensors'
  // "M.weight_packed" and GPTQ's "M.qweight"): what a state dict, a model and a converted
  // checkpoint call it.
  std::string decoded_name;

  // The tensors of its quant state (bitsandbytes: absmax or SCB first, then the tables), which
  // belong to it and load as stored; empty for GGUF blocks.
  const std::vector<std::string>& companions() const;
};

// An optional T kept on the heap: std::optional's interface (empty, or one T that copies copy),
// a pointer's size. For a large member that most values leave empty: a catalog of 100,000
// tensors, few of them packed, stays half the size with TensorInfo::packed boxed.
template <typename T>
class Boxed {
 public:
  Boxed() = default;
  Boxed(std::nullopt_t) {}  // NOLINT: as std::optional converts from nullopt
  Boxed(T value) : value_(std::make_unique<T>(std::move(value))) {}  // NOLINT: as optional
  Boxed(const Boxed& other) : value_(other ? std::make_unique<T>(*other) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& other) {
    if (this != &other) value_ = other ? std::make_unique<T>(*other) : nullptr;
    return *this;
  }
  Boxed& operator=(Boxed&&) noexcept = default;
  Boxed& operator=(std::nullopt_t) {
    value_.reset();
    return *this;
  }

  bool has_value() const { return value_ != nullptr; }
  explicit operator bool() const { return has_value(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return value_.get(); }
  const T* operator->() const { return value_.get(); }
  void reset() { value_.reset(); }

 private:
  std::unique_ptr<T> value_;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;  // empty for a scalar
  uint32_t file = 0;            // index into Checkpoint::files()
  uint64_t offset = 0;          // absolute byte offset of the first data byte in that file
  uint64_t nbytes = 0;          // bytes in the file, from `offset`
  // A PyTorch archive's tensor: the storage entry it views ("archive/data/3"). Tensors of one
  // storage (views, tied weights) overlap in the file; a load reads those bytes once. Empty for
  // other formats.
  std::string storage;
  // Element strides, set only when the tensor is not C-contiguous in the file (a transposed or
  // expanded view): [offset, offset + nbytes) then spans its first to its last element, and a
  // load materialises it contiguously.
  std::vector<uint64_t> strides;
  // Its elements are stored big-endian (an archive torch.save wrote on a big-endian machine);
  // a load swaps their bytes.
  bool big_endian = false;
  // Set for a block-quantized tensor cataloged packed (above); it loads as stored.
  Boxed<PackedLayout> packed;

  uint64_t numel() const;  // 1 for a scalar, 0 when any dimension is 0
  // Its elements: numel(), or for a packed tensor those of PackedLayout::element_shape.
  uint64_t element_count() const;
  // Its file bytes are the tensor as loaded before any cast: contiguous and little-endian.
  bool plain_layout() const { return strides.empty() && !big_endian; }
  // The name it has once decoded (PackedLayout::decoded_name: a compressed-tensors or GPTQ
  // weight's "M.weight"), or its own: what a state dict, a model and a converted checkpoint
  // call it once dequantized.
  const std::string& decoded_name() const {
    return packed && !packed->decoded_name.empty() ? packed->decoded_name : name;
  }
};

// What loadstone takes from the model's config.json: only what a load needs. A folder's
// config.json is read (after `subfolder`), or the one beside an index file; never for a single
// .safetensors file given by path.
struct ModelConfig {
  std::string path;  // the config.json read; empty when there is none
  std::string text;  // its bytes as read (what `convert` writes beside its output)
  // quantization_config.quant_method ("fp8", "compressed-tensors", ...), or empty.
  std::string quant_method;
  // quantization_config.weight_block_size: the rows x columns one float8 scale covers.
  std::optional<std::array<uint64_t, 2>> weight_block_size;
  // GPTQ and AWQ settings: `bits` (AWQ: also `w_bit`), `group_size` (-1: one group; AWQ: also
  // `q_group_size`), `checkpoint_format` ("gptq" = v1, "gptq_v2"), AWQ's `version` ("gemm").
  std::optional<uint32_t> bits;
  std::optional<int64_t> group_size;
  std::string checkpoint_format;
  std::string version;
  // num_hidden_layers (else text_config's) and num_nextn_predict_layers (DeepSeek's
  // multi-token-prediction layers, stored after the decoder's): the execution order puts those
  // last (PlanOptions::order). Unset / 0 when absent or not a count.
  std::optional<int> num_hidden_layers;
  int num_nextn_predict_layers = 0;
};

struct OpenOptions {
  // Weight variant, as in Hugging Face `variant=`: "fp16" selects model.fp16.safetensors,
  // model.safetensors.index.fp16.json, ... Empty: the plain names.
  std::string variant;
  // A folder inside the model folder (diffusers: "unet", "vae", "text_encoder").
  std::string subfolder;
  // Every tensor as its file stores it: no bitsandbytes, compressed-tensors, GPTQ or AWQ layout
  // is recognised (no PackedLayout; their tensors load as stored, and one shard opens without
  // the others), as safetensors.safe_open sees a file. GGUF block tensors stay packed: that is
  // their format's own layout.
  bool as_stored = false;
  // hf:// addresses read the Hugging Face cache as huggingface_hub does. Once the Hub has named
  // the commit it serves, a checkpoint whose files (the index and every shard) are all at
  // snapshots/COMMIT/ in the cache is read there, not over the network; resolution() says so.
  // With HF_HUB_OFFLINE=1 the Hub is not asked: the revision is found through refs/, and a
  // checkpoint not in the cache is NotFound. The folder: `hub_cache`, else huggingface_hub's
  // (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).
  std::string hub_cache;
  // false: the cache is not read (every byte from the Hub; HF_HUB_OFFLINE is then an error).
  bool read_hub_cache = true;
};

class Checkpoint {
 public:
  // Opens `path`: a .safetensors file; a PyTorch .bin/.pt/.pth archive; an index file
  // (*.index.json, over safetensors or .bin shards); an offload folder (a folder whose only
  // checkpoint is accelerate's index.json: its NAME.dat files and the safetensors tensors it
  // references, in index order); or a folder holding model.safetensors,
  // model.safetensors.index.json + shards, pytorch_model.bin, pytorch_model.bin.index.json,
  // diffusion_pytorch_model*, with `options.variant` and `options.subfolder` applied as Hugging
  // Face applies them. Where a folder holds several candidates the preference is Hugging Face's:
  // safetensors before .bin, single file before index; model.* and pytorch_model.* before
  // diffusion_pytorch_model.*; the choice, and what was passed over, is reported in
  // resolution(). Two candidates of the same rank are an InvalidArgument error naming both.
  //
  // Errors: NotFound (no such path, no checkpoint in the folder, a shard missing), Corruption
  // (a header or index that breaks the rules; the message names the reference error, file,
  // tensor and offset), IOError, Unsupported (a format not handled yet).
  static Result<Checkpoint> Open(const std::string& path, const OpenOptions& options = {});
  // Opens `folder` as accelerate's offload folder (its index.json), whatever else it holds (an
  // offload folder may be the model's own folder). Errors: as Open.
  static Result<Checkpoint> OpenOffloadFolder(const std::string& folder);

  // A catalog over the same files that lists `tensors` instead: views of byte ranges of those
  // files, e.g. a large tensor cut into pieces so that each loads on its own (`loadstone
  // convert` bounds its memory so; a tensor-parallel rank can load its rows). Each must name a
  // file of this checkpoint (TensorInfo::file), lie inside it, have a unique name and, unless
  // packed or strided, as many bytes as its shape and dtype need. Errors: InvalidArgument
  // naming the first tensor that breaks a rule.
  Result<Checkpoint> WithTensors(std::vector<TensorInfo> tensors) const;

  CheckpointFormat format() const;
  const std::vector<CheckpointFile>& files() const;
  // Every tensor of every file, in file order, then offset order within a file.
  const std::vector<TensorInfo>& tensors() const;
  // nullptr when there is no tensor of that name.
  const TensorInfo* Find(std::string_view name) const;
  // The scales beside float8 weight `weight`, which make it a quantized weight a load with a
  // floating-point target dequantizes: DeepSeek-V3's "W_scale_inv", else compressed-tensors'
  // "W_scale" (docs/conversions.md, "FP8 weights"). nullptr for a tensor that is not float8 or has
  // neither. Whether the scales fit the weight is the planner's to say (PlanOptions::fp8_block).
  const TensorInfo* Float8Scales(const TensorInfo& weight) const;
  // The one rule for which tensors belong to a quantized weight, that every consumer asks (the
  // plan, convert, the LibTorch and Python faces, state-dict matching): the tensors a load
  // reads with `weight` to dequantize it — a packed weight's quant state
  // (PackedLayout::companions(): absmax, SCB, weight_scale, ..., in that order), or a float8
  // weight's scales (Float8Scales). Empty for a tensor with none (a plain tensor; a GGUF
  // block-quantized one, whose scales are inside its blocks). Errors: InvalidArgument naming a
  // quant-state tensor the checkpoint lacks (a WithTensors view that left it out).
  Result<std::vector<const TensorInfo*>> Companions(const TensorInfo& weight) const;
  // True when a floating-point target dequantizes `weight`: it is packed (quantized blocks or a
  // quant state) or float8 with scales.
  bool Dequantizes(const TensorInfo& weight) const;
  // The files' "__metadata__" entries (a key given by several shards keeps the first value).
  const std::map<std::string, std::string>& metadata() const;
  // The index file used, or empty.
  const std::string& index_path() const;
  // The path or address Open was given (an hf:// address as written, revision and all).
  const std::string& source() const;
  // How the path was resolved, e.g. "folder: picked model.safetensors.index.json (3 shards)".
  const std::string& resolution() const;
  const ModelConfig& config() const;
  // What Open noticed and went on without (a config.json it could not use, ...).
  const std::vector<std::string>& warnings() const;
  uint64_t total_bytes() const;  // sum of tensor nbytes
  // A hash of what a plan depends on: every file's path and size, every tensor's name, dtype,
  // shape, file, offset and size. Equal for two Opens of unchanged files; a plan made for one
  // checkpoint is refused by a load of another (LoadPlan::checkpoint_fingerprint).
  uint64_t fingerprint() const;

  struct Impl;
  explicit Checkpoint(std::shared_ptr<const Impl> impl);

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace loadstone

#endif  // LOADSTONE_CHECKPOINT_H_
