// The distributed face: ranks that meet through PyTorch's c10d (a TCPStore rendezvous, Gloo
// process groups on the CPU) and load a checkpoint tensor-parallel (loadstone/tensor_parallel.h),
// each reading only its share. libloadstone_dist.so, target loadstone::dist; needs LibTorch with
// c10d (Debian's libtorch 1.13 has it, with Gloo).
//
//   loadstone::GroupOptions group;                   // or from torchrun's environment
//   group.world_size = 4; group.rank = r; group.master_port = 29500;
//   auto groups = loadstone::ProcessGroups::Connect(group, /*tp=*/4);
//   loadstone::ParallelOptions par{4, r, 4};
//   auto rank = loadstone::LoadRank(loader, *ckpt, par, plan_options, **groups);
//
// Every call that waits on other ranks is bounded by GroupOptions::timeout: a rank that dies, a
// store that does not answer or a rank whose checkpoint differs ends every rank's call with an
// error naming what it waited for, never a hang.
#ifndef LOADSTONE_DIST_H_
#define LOADSTONE_DIST_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/status.h"
#include "loadstone/tensor_parallel.h"

namespace loadstone {

struct GroupOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int world_size = 1;
  int rank = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// GroupOptions from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) over
// `defaults`: what is set there wins. Errors: InvalidArgument naming a variable that is not a
// number in range.
Result<GroupOptions> GroupOptionsFromEnvironment(GroupOptions defaults);

// The rendezvous and the process groups of one rank: the world, and the rank's tensor-parallel
// group (tp consecutive ranks). Rank 0 serves the store.
class ProcessGroups {
 public:
  virtual ~ProcessGroups() = default;
  // Errors: InvalidArgument (options that do not fit), IOError (the store or a peer not reached
  // within the timeout, naming the address).
  static Result<std::unique_ptr<ProcessGroups>> Connect(const GroupOptions& options, int tp);

  virtual Exchange& exchange() = 0;  // the tensor-parallel group's
  // Every rank of the world exchanges `value` (a checkpoint's fingerprint, a status): the
  // values of all ranks, in rank order.
  virtual Result<std::vector<uint64_t>> AllGather(uint64_t value) = 0;
  // Every rank of the world: `data` of rank `root` lands in every other rank's `data` (all the
  // same size). Errors: IOError (a peer gone or the timeout), naming the rank.
  virtual Status Broadcast(std::span<std::byte> data, int root) = 0;
  virtual const GroupOptions& options() const = 0;
};

// What a rank loaded: its tensors (its parts), and what moved.
struct RankLoad {
  RankShare share;  // share.options as given (kAuto stays kAuto), share.read_mode as taken
  LoadPlan plan;
  std::vector<Tensor> tensors;
  ReadStats read_stats;
  uint64_t received_bytes = 0;  // bytes other ranks sent it in the exchange
  double load_seconds = 0;      // its reads, until its share was loaded
  double exchange_seconds = 0;  // the exchange (0 when nothing is exchanged)
  // ReadMode::kAuto: what was measured (bytes a second: the group's storage, as its first rank
  // read a sample; the slowest rank's link in an all-to-all), the model's estimates, and the
  // bytes this rank read for it (read again by the load). share.read_mode is the mode taken.
  double measured_read_bytes_per_s = 0;
  double measured_link_bytes_per_s = 0;
  ReadModeCost read_mode_cost;
  uint64_t probe_bytes = 0;
};

// Loads rank par.rank's share of `checkpoint` and makes its tensors: ShareOf, Plan with
// RankPlanOptions(options), the load, then AssembleShare over `groups`' exchange. The ranks agree
// at each step, every rank failing with the first cause: before planning on their catalogs
// (every tensor's name, dtype, shape and offset: InvalidArgument naming a rank with another
// checkpoint), before reading on their splits and loaded dtypes (another plan, --dtype or bucket
// size), before exchanging on having their shares (IOError naming a rank that failed). With
// ReadMode::kAuto each group measures its link and storage first and takes the mode
// EstimateReadModes finds faster. A device map that places anything off the CPU is Unsupported.
// Errors: also those of the steps.
Result<RankLoad> LoadRank(Loader& loader, const Checkpoint& checkpoint,
                          const ParallelOptions& par, const PlanOptions& options,
                          ProcessGroups& groups);

// The entry points above, for a program that loads libloadstone_dist.so (and with it LibTorch)
// only when a distributed load is asked for — the `loadstone` CLI: dlopen the library (beside
// libloadstone.so) and call loadstone_dist_api(). `version` is kDistApiVersion of the header the
// library was built with; a program checks it before using the rest.
inline constexpr uint32_t kDistApiVersion = 2;  // 2: ParallelOptions gained pp
struct DistApi {
  uint32_t version = kDistApiVersion;
  Result<GroupOptions> (*group_options_from_environment)(GroupOptions defaults);
  Result<std::unique_ptr<ProcessGroups>> (*connect)(const GroupOptions& options, int tp);
  Result<RankLoad> (*load_rank)(Loader& loader, const Checkpoint& checkpoint,
                                const ParallelOptions& par, const PlanOptions& options,
                                ProcessGroups& groups);
};

}  // namespace loadstone

// The symbol to look up with dlsym: the library's DistApi.
extern "C" const loadstone::DistApi* loadstone_dist_api();

#endif  // LOADSTONE_DIST_H_
