// Tensor-parallel loading: what one rank of a group reads of a checkpoint, and how the ranks'
// reads become each rank's tensors. Sharding follows Hugging Face transformers' tp_plan (its
// styles and patterns, torch.chunk splits): docs/distributed.md.
//
//   loadstone::ParallelOptions par;
//   par.world_size = 4; par.rank = 1; par.tp = 4;          // plan: config.json's, or tp_plan_json
//   auto share = loadstone::ShareOf(*ckpt, par);            // pure data, no I/O
//   auto plan = loadstone::Plan(share->reads, loadstone::RankPlanOptions(plan_options));
//   auto handle = loader.Load(share->reads, *plan);
//   handle.Done().get();
//   auto tensors = loadstone::AssembleShare(*share, handle.Tensors(), exchange);
//
// No byte of a split tensor is read by two ranks of a group. A tensor whose every rank's part is
// one contiguous range of the file (a column-wise split of a row-major weight, an embedding's
// rows, a 1-D chunk) is read as that range and is the rank's tensor as it lands. Any other split
// (row-wise: a strided piece of every row) is read as one contiguous block of elements per rank
// (disjoint, a few large reads), and the ranks exchange what each needs of
// the others' blocks in one all-to-all per bucket (Exchange: c10d's, loadstone/dist.h).
// Replicated tensors are read whole by every rank.
#ifndef LOADSTONE_TENSOR_PARALLEL_H_
#define LOADSTONE_TENSOR_PARALLEL_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"

namespace loadstone {

// The rank and its groups: world_size ranks, tensor-parallel groups of `tp` consecutive ranks
// (tp innermost, as transformers' and vLLM's meshes: tp rank = rank % tp), `pp` consecutive groups
// making one pipeline (stage = (rank / tp) % pp), each pipeline loading the whole model once.
// Stage s holds the layers vLLM gives it (get_pp_indices: layers / pp each, the remainder one each
// to the stages before the last), the input embeddings on the first stage (and the last, when the
// head is tied to them), every other tensor outside the layers (final norm, head) on the last.
// How a tensor-parallel group gets its bytes off storage.
enum class ReadMode : uint8_t {
  kEachRank,  // each rank reads its own parts (and a block of the strided ones); the default
  kOnce,      // the group's first rank reads every tensor of the stage once, whole, and sends
              // each other rank its parts (replicated tensors whole) over the group's exchange
  kAuto,      // LoadRank chooses by EstimateReadModes, from read and link bandwidths it measures
};
std::string_view ReadModeName(ReadMode mode);  // "each", "once", "auto"

struct ParallelOptions {
  int world_size = 1;
  int rank = 0;
  int tp = 1;
  int pp = 1;
  // Layers per stage, one count per stage (vLLM's VLLM_PP_LAYER_PARTITION); empty: vLLM's split.
  std::vector<int> pp_layers;
  // transformers' tp_plan as a JSON object of full names ({"model.layers.*.self_attn.q_proj":
  // "colwise", "lm_head": "colwise_gather_output", ...}), used as given. Empty: the plan
  // transformers would use for the checkpoint's config.json (its base_model_tp_plan, else the
  // model type's built-in one, with the embeddings' and the head's entries).
  std::string tp_plan_json;
  // Expert parallelism over each tensor-parallel group, as transformers' ep_size = tp_size: each
  // rank holds experts [r·E/tp, (r+1)·E/tp) of every MoE layer — the checkpoint's tensors of those
  // experts whole when it stores one per expert ("mlp.experts.3.gate_proj.weight", quantized ones
  // with their scales), its part of dim 0 when it stores them stacked ("mlp.experts.gate_up_proj",
  // grouped_gemm) — and reads nothing of the others'. E must divide by tp. The ep plan:
  // ep_plan_json (full names, as tp_plan_json), else config.json's base_model_ep_plan, else the
  // model type's; its rules replace the tp plan's for the same modules.
  bool expert_parallel = false;
  std::string ep_plan_json;
  // Bytes of one exchange bucket: the split tensors exchanged together in one all-to-all hold at
  // most this many bytes in total (a larger tensor goes alone).
  uint64_t bucket_bytes = 256ULL << 20;
  ReadMode read_mode = ReadMode::kEachRank;
};

// A run of `count` elements of the full tensor (row-major) from element `first`.
struct ElementRange {
  uint64_t first = 0;
  uint64_t count = 0;
  friend bool operator==(const ElementRange&, const ElementRange&) = default;
};

// One tensor of a rank's share.
struct TensorShard {
  std::string name;
  // transformers' style name from the plan ("colwise", "rowwise", ...); empty when no rule
  // applies (the tensor is replicated).
  std::string style;
  std::vector<uint64_t> full_shape;
  std::vector<uint64_t> shape;  // this rank's part
  // The split dimension (-1: whole) and, for every rank of the group, the intervals of it that
  // rank holds; its part is, for each index of the dimensions before `dim`, those intervals in
  // order.
  int dim = -1;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> cuts;
  // Exchanged: every rank r of the group reads elements [blocks[r].first, blocks[r].second) of
  // the full tensor (row-major; the elements split evenly: n·r/tp .. n·(r+1)/tp), as a 1-D
  // tensor of that name in `reads`, and the parts are made by the exchange. Otherwise this rank
  // reads its part as it is (`reads` has a tensor of this name and shape, unless it is empty).
  bool exchanged = false;
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
};

struct RankShare {
  ParallelOptions options;
  int tp_rank = 0;   // rank within its tensor-parallel group
  int group = 0;     // which tensor-parallel group (rank / tp)
  int stage = 0;     // its pipeline stage ((rank / tp) % pp)
  std::pair<int, int> layers;  // the stage's layers [first, end) when pp > 1
  ReadMode read_mode = ReadMode::kEachRank;  // kEachRank or kOnce
  // What this rank reads, as a catalog over the checkpoint's files (Checkpoint::WithTensors):
  // its part or row block of each tensor, under the tensor's own name; plan and load this.
  Checkpoint reads;
  // The stage's tensors this rank holds, in the checkpoint's order: all of them, but for the
  // tensors of other ranks' experts (expert_parallel), which `elsewhere` names.
  std::vector<TensorShard> tensors;
  std::vector<std::string> elsewhere;
  uint64_t read_bytes = 0;        // file bytes this rank reads
  uint64_t split_bytes = 0;       // file bytes of the stage's split tensors (whole), experts too
  // File bytes of the stage's one-expert tensors (every rank's; in split_bytes): each read by
  // its own rank only, never exchanged.
  uint64_t expert_bytes = 0;
  uint64_t replicated_bytes = 0;  // file bytes of the stage's tensors every rank of it reads whole
  uint64_t exchanged_bytes = 0;   // file bytes of the stage's exchanged tensors (whole)
};

// Rank options.rank's share of `checkpoint`. With ReadMode::kOnce, tensor-parallel rank 0 reads
// every tensor of its stage whole (as a block of all its elements) and the others read none
// (each tensor a block of no elements, so that it gets its dtype): every tensor is exchanged,
// except scalars, empty tensors and replicated quantized or strided ones, which every rank
// reads, and one expert's tensors, which the rank holding that expert reads. Errors:
// InvalidArgument (a rank, world size, tp or pp that does not fit: tp × pp must divide
// world_size; pp_layers of another length or sum, or without pp > 1; expert_parallel without
// tp > 1, ep_plan_json without expert_parallel; a bad tp_plan_json or ep_plan_json; a style that
// does not fit a tensor's shape; experts that do not split evenly over tp, naming the module;
// kAuto, which LoadRank resolves), NotFound (no plan given and none known for the config's model
// type, or no config.json), Unsupported (a split tensor that is quantized, packed or not stored
// contiguous and little-endian, naming it).
Result<RankShare> ShareOf(const Checkpoint& checkpoint, const ParallelOptions& options);

// The cost model of the two read modes for one group, in seconds: `each` — a rank's share of
// ReadMode::kEachRank (ShareOf) — read at `read_bytes_per_s` (what the storage gives the group's
// ranks together) while each rank receives its exchanged parts at `link_bytes_per_s` (one rank's
// link); once — the stage read at `read_bytes_per_s` while its first rank sends everyone else's
// parts over its link. Reads and the exchange do not overlap today, so each is their sum.
struct ReadModeCost {
  double each_seconds = 0;
  double once_seconds = 0;
};
ReadModeCost EstimateReadModes(const RankShare& each, double read_bytes_per_s,
                               double link_bytes_per_s);

// The options to plan a rank's reads (RankShare::reads) with: `options` with no gap read between
// two coalesced tensors (PlanOptions::coalesce_gap 0), since the gaps of a rank's catalog hold the
// other ranks' parts. The plan then reads exactly RankShare::read_bytes.
PlanOptions RankPlanOptions(PlanOptions options);

// Moves bytes between the ranks of one tensor-parallel group. Implemented over c10d process
// groups (loadstone/dist.h); one call at a time, made by every rank of the group in the same
// order.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  // All-to-all: send_counts[q] bytes of `send` (in rank order) go to rank q, recv_counts[r]
  // bytes from rank r land in `recv` (in rank order). Counts to and from itself are 0.
  virtual Status AllToAll(std::span<const std::byte> send, std::span<const uint64_t> send_counts,
                          std::span<std::byte> recv, std::span<const uint64_t> recv_counts) = 0;
};

// Copies rank `rank`'s part of `s` (its cuts; the whole tensor when s.dim < 0) out of the full
// tensor at `full` (row-major, `elem` bytes an element) to `part`, in the part's order.
void CopyPartOf(const TensorShard& s, int rank, const std::byte* full, std::byte* part,
                uint64_t elem);

// This rank's tensors (share.tensors' order, each of its part's shape) from `loaded` (the load of
// share.reads, on the CPU) and, for exchanged tensors, the group's exchange. A tensor read as
// its part is returned as loaded (no copy). `exchange` may be null when nothing is exchanged.
// Errors: InvalidArgument (a loaded tensor missing, not on the CPU or not of its part's size; an
// exchange needed and none given, or one that does not fit the group), the exchange's error.
Result<std::vector<Tensor>> AssembleShare(const RankShare& share,
                                          const std::vector<Tensor>& loaded, Exchange* exchange);

}  // namespace loadstone

#endif  // LOADSTONE_TENSOR_PARALLEL_H_
