// LoadPlan: what a load will do, as pure data — for every tensor its destination, target dtype
// and conversion, and the read schedule (coalesced chunks per file, in priority order).
//
//   loadstone::PlanOptions opt;
//   opt.dtype = loadstone::DType::kBF16;
//   opt.keep_in_fp32 = {"norm"};
//   auto plan = loadstone::Plan(*ckpt, opt);   // printable with plan->ToString()
//
// Plans are built without I/O and may be inspected, tested and reused for several loads of the
// same checkpoint.
#ifndef LOADSTONE_PLAN_H_
#define LOADSTONE_PLAN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/plan_order.h"
#include "loadstone/status.h"

namespace loadstone {

enum class Conversion {
  kNone,  // bytes land as they are in the file
  kCast,  // a float cast (f32/f16/bf16/f64/float8 → f32/f16/bf16), exact as PyTorch
  // A float8 weight times its block scales (docs/conversions.md, "FP8 weights"), into `dtype`.
  kDequantFp8Block,
  // The file bytes gathered into C order and/or byte-swapped, no cast: a strided view or a
  // big-endian tensor of a PyTorch archive (TensorInfo::strides, big_endian), by a CPU worker
  // (for a GPU target, before the device copies the result). A cast of such a tensor is a kCast
  // that does the same first.
  kRelayout,
  // A packed block-quantized tensor (TensorInfo::packed: GGUF Q4_0 ... Q6_K) decoded into `dtype`
  // (docs/conversions.md, "GGUF blocks"; runtime/convert/gguf_blocks.h), by a CPU worker as its read
  // completes; for a GPU target by the device, from the packed bytes (ConversionSite::kDevice;
  // kCpuThenDevice for a device that cannot: a worker decodes, the device copies the result).
  // Its reads hold whole blocks; its shape once loaded is PackedLayout::element_shape.
  kDequantBlocks,
  // A bitsandbytes 4-bit weight (TensorInfo::packed with PackedLayout::bnb4: "bnb-nf4",
  // "bnb-fp4") decoded into `dtype` with its per-block absmax (TensorPlan::scale: planned and read
  // before it, loaded as stored) by a CPU worker as its read completes (docs/conversions.md;
  // runtime/convert/bitsandbytes.h). Two codes a byte: any piece of whole bytes decodes on its own. Its
  // shape once loaded is PackedLayout::element_shape. For a GPU target the device decodes the
  // packed bytes (as kDequantBlocks), the absmax and the nested tables copied there first; the
  // absmax tensor itself stays in host memory, loaded as stored.
  kDequantBnb4,
  // A bitsandbytes LLM.int8 weight (PackedLayout::bnb8, "row" format) decoded into `dtype` with
  // its row absmax (TensorPlan::scale: the SCB tensor, as stored), elementwise, by a CPU worker
  // (runtime/convert/bitsandbytes.h); for a GPU target as kDequantBnb4 does.
  kDequantBnb8,
  // A packed-integer weight (PackedLayout::packed_int: compressed-tensors pack-quantized, GPTQ,
  // AWQ) decoded into `dtype` with its scales (TensorPlan::scale: weight_scale or scales, as
  // stored; the zero points and g_idx are in the catalog), elementwise by a CPU worker
  // (runtime/convert/packed_int.h), from reads of whole 32-bit words (GPTQ and AWQ: of the whole
  // tensor); for a GPU target as kDequantBnb4 does. Loaded as [out, in]; its name once decoded is
  // PackedLayout::decoded_name.
  kDequantPackedInt,
};

// "none", "cast", "fp8-block-dequant", "relayout", "block-dequant", "bnb4-dequant",
// "bnb8-dequant", "int-dequant".
std::string_view ConversionName(Conversion conversion);

// True for the conversions whose result has the packed tensor's element shape (PackedLayout):
// kDequantBlocks, kDequantBnb4, kDequantBnb8 and kDequantPackedInt.
constexpr bool Unpacks(Conversion conversion) {
  return conversion == Conversion::kDequantBlocks || conversion == Conversion::kDequantBnb4 ||
         conversion == Conversion::kDequantBnb8 || conversion == Conversion::kDequantPackedInt;
}

// True for the conversions that read another planned tensor (TensorPlan::scale) while they
// convert: kDequantFp8Block, kDequantBnb4, kDequantBnb8 and kDequantPackedInt.
constexpr bool UsesScales(Conversion conversion) {
  return conversion == Conversion::kDequantFp8Block || conversion == Conversion::kDequantBnb4 ||
         conversion == Conversion::kDequantBnb8 || conversion == Conversion::kDequantPackedInt;
}

// True for the conversions a CPU worker decodes from scales kept in host memory, elementwise
// (the quantized weights with a quant state: bitsandbytes, compressed-tensors).
constexpr bool DecodesWithState(Conversion conversion) {
  return conversion == Conversion::kDequantBnb4 || conversion == Conversion::kDequantBnb8 ||
         conversion == Conversion::kDequantPackedInt;
}

// Where a planned tensor's bytes live once loaded (TensorPlan::memory), as the plan decided from
// its device, the flags below and its reads' routes. The Loader makes exactly this memory, with
// one departure, made where the route rules are (runtime/pipeline/routes.h, MemoryAtStart):
// fresh pages on a system that refuses userfaultfd are a host buffer instead.
enum class TensorMemory : uint8_t {
  kHost,        // a host buffer of its own, its first byte at its file offset's phase within a
                // page (O_DIRECT reads land straight in it), unless align_tensors or a conversion
  kDevice,      // memory of its "cuda:N" device
  kCaller,      // the caller's (caller_memory: LoadOptions::destination)
  kPinned,      // pinned host memory of the load's GPU (pinned)
  kMapped,      // a private mapping of its file (ReadRouteOptions::mmap, no conversion)
  kFreshPages,  // fresh pages the workers fill (fresh_pages)
  kArena,       // a 64-byte-aligned block shared with other small tensors (under
                // kArenaTensorMax bytes, every read of it staged), filled out of staging
  kShared,      // the one buffer of its read (ReadChunk::shared_buffer), as the file has it
};
inline constexpr size_t kTensorMemoryCount = 8;
// Tensors under this many bytes whose every read is staged share arena blocks (kArena).
inline constexpr uint64_t kArenaTensorMax = 64ULL << 10;
std::string_view TensorMemoryName(TensorMemory memory);  // "host", "device", ..., "shared"

// Where a planned tensor's conversion runs (TensorPlan::conversion_site), as the plan decided
// from its conversion, its layout and its device. The Loader runs it exactly there, with one
// departure, made where the route rules are (runtime/pipeline/routes.h, SiteAtStart) and counted
// (ReadStats::conversions_moved): a quantized weight planned to be decoded by a device that turns
// out to lack the kernels (Accelerator::DecodesQuantized) is decoded by the workers instead.
enum class ConversionSite : uint8_t {
  kNone,           // no conversion: the bytes are read, copied or mapped as they are
  kCpu,            // a CPU tensor: a worker converts its staged bytes into its memory
  kDevice,         // a GPU tensor: its device converts the copied bytes (a cast, a dequant kernel)
  kCpuThenDevice,  // a GPU tensor: a worker relayouts or decodes it first, the device copies
                   // the result (and casts it, if its conversion says so)
};
inline constexpr size_t kConversionSiteCount = 4;
std::string_view ConversionSiteName(ConversionSite site);  // "none", "cpu", "device", "cpu+device"

struct TensorPlan {
  size_t source = 0;             // index into Checkpoint::tensors()
  uint32_t device = 0;           // index into LoadPlan::targets
  DType dtype = DType::kF32;     // the dtype it will have once loaded
  Conversion conversion = Conversion::kNone;
  uint64_t nbytes = 0;           // bytes once loaded
  // kDequantFp8Block: the scales (an index into LoadPlan::tensors, planned and read before this
  // tensor, loaded as stored) and the rows x columns of the weight that one scale covers.
  // kDequantBnb4 / kDequantBnb8 / kDequantPackedInt: `scale` is its absmax / SCB / weight_scale
  // tensor, as stored, in host memory; no block rows and columns.
  uint32_t scale = 0;
  uint64_t block_rows = 0;
  uint64_t block_cols = 0;
  // Its memory is fresh pages (ReadRouteOptions::fill_fresh_pages), filled by the workers, never
  // by the reader: a CPU tensor of 64 KiB or more, or any tensor of a shared buffer of 64 KiB or
  // more (ReadChunk::shared_buffer).
  bool fresh_pages = false;
  // Its memory is the caller's (PlanOptions::caller_memory, LoadOptions::destination): copied
  // into by the workers out of the page cache when its bytes are cached (route taken: page-cache
  // copy), staged and copied into it when they are cold (with stage_cold_reads; without, read
  // straight into it); never fresh pages, a shared buffer or a mapping.
  bool caller_memory = false;
  // Its memory is pinned host memory of the load's GPU (PlanOptions::pin_cpu_tensors): read in
  // place (staged when cold), never fresh pages, a shared buffer or a mapping.
  bool pinned = false;
  // Memory that comes from elsewhere (the caller's, or pinned): the routes that choose their own
  // memory (fresh pages, shared buffers, mappings) are not for it.
  bool memory_given() const { return caller_memory || pinned; }
  // Its memory (above), chosen by Plan() once its reads are scheduled.
  TensorMemory memory = TensorMemory::kHost;
  // Where its conversion runs (above), chosen by Plan() from `conversion`, its layout and its
  // device: for a quantized weight on a GPU, kDevice when the planning platform's GPU decodes
  // (PlatformGpu::decodes_quantized), else kCpuThenDevice.
  ConversionSite conversion_site = ConversionSite::kNone;
};

// A tensor the device map sends to "disk" (LoadPlan::offloaded). Loader::Load does not load it:
// WriteOffload (offload.h) writes it into the offload folder in accelerate's format, unless it is
// read in place, and an OffloadStore materialises it on any device when it is needed.
struct OffloadPlan {
  size_t source = 0;          // index into Checkpoint::tensors()
  DType dtype = DType::kF32;  // the dtype it has once materialised
  Conversion conversion = Conversion::kNone;
  std::vector<uint64_t> shape;  // once materialised (a dequantized GGUF tensor's elements)
  uint64_t nbytes = 0;        // bytes once materialised
  // A safetensors tensor stored contiguous and little-endian: it is read where it is when it is
  // needed (cast then, if `conversion` says so) and nothing is written, as accelerate references
  // safetensors weights (index entries with safetensors_file / weight_name).
  bool in_place = false;
};

// How a read's bytes reach their tensors. The plan gives each read one; the Loader carries it
// out, and where a fact known only when the read's turn comes decides between two routes, the
// planned route names both (runtime/pipeline/routes.h holds that rule, and the trace and
// ReadStats::routes report the route each read took).
enum class ReadRoute : uint8_t {
  kInPlace,         // read straight into its tensor's (or its tensors' shared) buffer
  kStaged,          // read into staging, then converted, copied or sent to a device
  kStagedWhenCold,  // kStaged when its bytes must come from the device, else kInPlace
  kFreshPages,      // into fresh pages: copied out of the page cache when cached, else kStaged
  kMapped,          // nothing read: its tensor points into a private mapping of its file
  kPageCacheCopy,   // taken, never planned: a kFreshPages read, or one into the caller's memory,
                    // found cached and copied out of the page cache by a worker
};
inline constexpr size_t kReadRouteCount = 6;
static_assert(static_cast<size_t>(ReadRoute::kPageCacheCopy) + 1 == kReadRouteCount);

// "in place", "staged", "staged when cold", "fresh pages", "mapped", "page-cache copy".
std::string_view ReadRouteName(ReadRoute route);

// Reads and their bytes on one route; RouteCounts has one per route, indexed by ReadRoute.
struct RouteCount {
  uint64_t reads = 0;
  uint64_t bytes = 0;
};
using RouteCounts = std::array<RouteCount, kReadRouteCount>;

// What decides the routes (LoadPlan::reads[i].route).
//
// mmap: CPU tensors that need no conversion are mapped instead of read (zero copies; pages
//   come in on first touch). Converted tensors are still read.
// stage_cold_reads: a CPU tensor whose bytes must come from the device (not in the page cache,
//   O_DIRECT possible) is read into reused huge-page staging and copied into place by the
//   workers; a cached one is read in place. Staging is physically contiguous, so the device
//   gets larger requests and no page faults on the reader's thread (docs/pipeline.md).
// fill_fresh_pages: CPU tensors of 64 KiB and more are written into pages the kernel does not
//   zero first: the workers fill their never-touched pages with userfaultfd's UFFDIO_COPY
//   (allocation and copy in one step, where a plain write faults, zeroes, then copies), either
//   straight out of the page cache (a cached read needs no read at all) or out of staging.
//   The gain is on warm loads (bench/README.md, "Fresh pages"). Where userfaultfd is
//   unavailable, the load's backend line
//   says so and these reads take the route they would have had without it.
// align_tensors: false (default): a tensor read in place starts at its file offset's phase
//   within a page, so that O_DIRECT lands straight in it, and small unconverted CPU tensors
//   that neighbour each other in the file share one buffer (ReadChunk::shared_buffer); their
//   data is then aligned as it is in the file (safetensors: to 8 bytes relative to the header's
//   end). true: every CPU tensor's data is 64-byte aligned: small ones are copied one by one
//   out of staging, and O_DIRECT needs a bounce copy (slower cold: docs/pipeline.md).
struct ReadRouteOptions {
  bool mmap = false;
  bool stage_cold_reads = true;
  bool fill_fresh_pages = true;
  bool align_tensors = false;
};

// One read: `length` bytes at `offset` of `file`, covering the given tensors' bytes (whole
// small tensors coalesced, or one piece of a large tensor). With `shared_buffer`, its tensors
// (small, unconverted, on the CPU, neighbours in the file) share one buffer that holds the read's
// bytes as the file does: the read lands in it as in one tensor, on any route, and each tensor
// points into it (a tensor kept alive keeps the whole buffer).
struct ReadChunk {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<uint32_t> tensors;  // indices into LoadPlan::tensors, in file order
  ReadRoute route = ReadRoute::kInPlace;
  bool shared_buffer = false;
};

// What to plan: the device-map options of device_map.h — every one of them honoured, exactly as
// `loadstone plan` honours them — plus what only a load needs. The default map is "cpu".
//
// dtype: the target for floating-point tensors, one of f32, f16 and bf16 (integer and bool
//   tensors are never cast; float8 weights with scales are dequantized into it, see fp8_block).
// keep_in_fp32: tensors kept in float32 when `dtype` is f16 or bf16: a pattern matches a tensor
//   when it equals one of its dotted components or a run of them ((^|\.)pattern($|\.)).
// special_dtypes: tensors cast to the dtype given (a float type) whatever `dtype` says (never
//   float8 scales or a quantized weight's quant-state tensors: those load as stored).
// device_map: "cpu" (default), one device ("cuda:1", "1"), or a mode inferred as accelerate
//   infers it ("auto", "balanced", "balanced_low_0", "sequential"), with max_memory, no_split,
//   strategy, fallback_allocation, offload_buffers, fixes and clean_result as documented there.
//   Budgets count the bytes this plan places: where loadstone converts up (a float8 weight
//   dequantized into bf16, f16 cast to f32, float8 scales kept in f32 under a bf16 target) a
//   tensor is sized after conversion, where accelerate sizes it as min(dtype, stored)
//   (docs/device-map.md, "Placed bytes").
struct PlanOptions : DeviceMapOptions {
  PlanOptions() { device_map = "cpu"; }

  // The order tensors are planned and read in. kGiven: `order_prefixes` (module prefixes or
  // tensor names; each must name at least one tensor of the checkpoint, else InvalidArgument).
  TensorOrder order = TensorOrder::kExecution;
  std::vector<std::string> order_prefixes;

  // A map given in full (accelerate's dict form; `loadstone plan --json` prints one), used as it
  // is instead of inferring one from `device_map`. Every tensor must fall under a key.
  std::optional<DeviceMap> explicit_map;
  // The model's module tree (class names, buffers, ties) to infer the map on, from a model
  // description (docs/model-json.md); unset: the tree of the checkpoint's tensor names.
  std::optional<ModuleTree> model;
  // Scaled float8 weights: a 2-D float8 tensor `W` with a sibling `W_scale_inv` (DeepSeek-V3:
  // f32, ceil(rows / block[0]) x ceil(cols / block[1]) scales) or `W_scale` (compressed-tensors:
  // f32/bf16/f16, per tensor, channel, group or block, told apart by its shape; a block scale
  // uses this block when it fits, else an exact division). With `dtype` set, each such weight is
  // dequantized into `dtype` (the scales stay as stored); without, both load as stored.
  // Unset: the checkpoint's quantization_config.weight_block_size (Checkpoint::config()), else
  // 128 x 128.
  std::optional<std::array<uint64_t, 2>> fp8_block;
  // The tensors to load (a pipeline or tensor-parallel rank's share); unset: all of them.
  // Others are neither read nor placed; the map is still inferred over the whole model, so a
  // tensor goes where it would in a full load. The scales of a float8 weight that is included
  // are included with it.
  std::function<bool(const TensorInfo&)> include;
  // Plain safetensors tensors mapped to "disk" are read where they are when needed
  // (OffloadPlan::in_place: transformers' convention; nothing is written). false: every disk
  // tensor is written to the offload folder as NAME.dat, as accelerate's
  // load_checkpoint_in_model and diffusers write it (a folder that outlives the checkpoint).
  bool offload_in_place = true;
  // Where tensors mapped to "disk" that cannot be read in place (OffloadPlan::in_place) are
  // written (WriteOffload). Empty: such a tensor is an error with diffusers' message ("The
  // current `device_map` had weights offloaded to the disk. Please provide an `offload_folder`
  // for them. ...").
  std::string offload_folder;
  // CPU tensors whose memory the caller gives at load time (LoadOptions::destination): a model
  // whose parameters are already allocated is filled in place, with no memory of loadstone's
  // (the weight-swap case). Unset: none. Tensors planned on a GPU or disk are not affected.
  std::function<bool(const TensorInfo&)> caller_memory;
  // CPU tensors (those not in the caller's memory) go into pinned host memory of the load's
  // first GPU (the Loader's first GPU when the plan has none), so that copying them to a GPU
  // later runs at the link's full rate, asynchronously — accelerate's CPU offload with pinned
  // memory. The load fails (Unsupported) on a Loader without a GPU, and (OutOfMemory, naming the
  // tensor) when the driver refuses to pin; on a simulated GPU the memory is ordinary host memory,
  // and the load's backend line says so.
  bool pin_cpu_tensors = false;
  // Quantized tensors stay packed, as stored, even with a target dtype (for engines with their
  // own kernels): sized and placed by their stored bytes, with their companions (absmax, quant
  // state). Without it a target dtype dequantizes every packed tensor loadstone can decode
  // (Conversion::kDequantBlocks, kDequantBnb4; keep_in_fp32 applies to the result; the
  // companions load as stored); the others stay packed, with a plan warning naming them.
  bool keep_packed = false;
  // Largest single read; larger tensors are read in pieces of this size.
  uint64_t max_chunk = 16ULL << 20;
  // Tensors smaller than this (and than max_chunk) are coalesced with their file neighbours into
  // one read: into one shared buffer where they need no conversion (ReadChunk::shared_buffer),
  // else through staging.
  uint64_t coalesce_below = 1ULL << 20;
  // The most bytes between two coalesced tensors (read with them), up to 4096: what lies between
  // two storages of a PyTorch archive. A tensor-parallel rank's reads set 0: the gaps in its
  // catalog are other ranks' parts (loadstone/tensor_parallel.h, RankPlanOptions).
  uint64_t coalesce_gap = 4096;
  ReadRouteOptions routes;
};

struct LoadPlan {
  std::vector<TensorPlan> tensors;  // priority order: PlanOptions::order, module by module
  std::vector<ReadChunk> reads;     // the read schedule, in priority order
  TensorOrder order = TensorOrder::kExecution;  // PlanOptions::order
  // `tensors` cut into the modules of the order, in that order (every tensor in one): a module
  // is the dotted name up to its first number ("model.layers.3"), a diffusers mid_block, else a
  // tensor's parent module; kGiven's prefixes. In file order a module may come back later.
  std::vector<PlanModule> modules;
  // Tensors mapped to "disk", in priority order: not read by Loader::Load (see OffloadPlan).
  std::vector<OffloadPlan> offloaded;
  std::string offload_folder;       // PlanOptions::offload_folder
  // The devices tensors go to, in Device order (GPUs by ordinal, then cpu);
  // TensorPlan::device indexes it.
  std::vector<Device> targets;
  ReadRouteOptions routes;          // the options the routes were chosen with
  // The device map used ({"": cpu} for a plain CPU load) with what the planner reports: bytes
  // per device (placed bytes, as this plan places them) against their budgets, the no-split
  // blocks, the explanation. Its warnings are moved into `warnings`.
  DevicePlan devices;
  // The device-map planner's warnings, then the plan's own (options that change nothing, such
  // as keep_in_fp32 without a reduced-float dtype or a pattern that matches no tensor).
  std::vector<std::string> warnings;
  std::array<uint64_t, 2> fp8_block = {128, 128};  // the float8 block used
  // Checkpoint::fingerprint() of the checkpoint planned; Loader::Load refuses another.
  uint64_t checkpoint_fingerprint = 0;
  uint64_t read_bytes = 0;          // bytes read from storage
  uint64_t placed_bytes = 0;        // bytes once loaded (after conversion), offloaded ones not
  uint64_t offloaded_bytes = 0;     // bytes of the offloaded tensors once materialised

  // The device tensor `t` goes to.
  const Device& device_of(uint32_t t) const { return targets[tensors[t].device]; }
  // Reads and bytes per planned route.
  RouteCounts RouteTotals() const;
  // A human summary: tensors per device and dtype, conversions, reads per route.
  std::string ToString() const;
};

// The dtypes a plan can cast floating-point tensors to: f32, f16, bf16.
bool IsCastTarget(DType dtype);

// Plans a load of `checkpoint`. Errors: InvalidArgument (a dtype that is not a cast target, an
// unknown device, a tensor no map entry covers, a special dtype that cannot be cast to, float8
// scales that fit no rule of `fp8_block`, a no-split class name on a tree without classes),
// Unsupported (mps; a float8 weight and its scales on two devices, or dequantized to disk), and
// the diffusers error above for a disk tensor that needs an offload folder when none is given.
Result<LoadPlan> Plan(const Checkpoint& checkpoint, const PlanOptions& options = {});

}  // namespace loadstone

#endif  // LOADSTONE_PLAN_H_
