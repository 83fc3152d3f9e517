// The distributed face (include/loadstone/dist.h) over c10d: a TCPStore rendezvous and Gloo
// process groups, the tensor-parallel exchange as one alltoall_base per bucket.
#include "loadstone/dist.h"

#include <charconv>
#include <cstdlib>
#include <exception>
#include <set>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

#include "bindings/dist/agree.h"
#include "bindings/dist/read_mode.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

namespace loadstone {
namespace {

using Clock = std::chrono::steady_clock;
using dist::Agree;

// Parts are made on the CPU (Gloo): a plan that places anything elsewhere is refused.
Status CheckOnCpu(const LoadPlan& plan) {
  std::string where = plan.offloaded.empty() ? "" : "disk";
  for (const Device& device : plan.targets) {
    if (device.type != Device::Type::kCpu) where = device.ToString();
  }
  if (where.empty()) return Status::OK();
  return Status::Unsupported(fmt::format(
      "a tensor-parallel load places its parts on the CPU for now (Gloo), and the device map "
      "sends some to {}: give --device-map cpu",
      where));
}

// Runs `body`, turning c10d's exceptions (a timeout, a peer gone) into an IOError that says what
// this rank waited for.
template <typename F>
auto Guarded(std::string_view what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return Status::IOError(fmt::format("{}: c10d: {}", what, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Status::IOError(fmt::format("{}: c10d: {}", what, e.what()));
  }
}

// Gloo's ops are bounded by `timeout` (its own); ranks that meet on a loopback address talk over
// loopback, others over the interface Gloo picks (GLOO_SOCKET_IFNAME, else the hostname's).
c10::intrusive_ptr<c10d::ProcessGroupGloo> NewGloo(c10::intrusive_ptr<c10d::Store> store,
                                                   int rank, int size,
                                                   const GroupOptions& group) {
  auto options = c10d::ProcessGroupGloo::Options::create(group.timeout);
  const bool loopback = group.master_addr.starts_with("127.") || group.master_addr == "localhost";
  options->devices.push_back(loopback
                                 ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                 : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(store), rank, size, options);
}

at::Tensor Bytes(const std::byte* data, uint64_t n) {
  static std::byte none{};
  return torch::from_blob(const_cast<std::byte*>(n == 0 ? &none : data),
                          {static_cast<int64_t>(n)}, torch::kUInt8);
}

class GlooExchange : public Exchange {
 public:
  GlooExchange(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t received() const { return received_; }

  Status AllToAll(std::span<const std::byte> send, std::span<const uint64_t> send_counts,
                  std::span<std::byte> recv, std::span<const uint64_t> recv_counts) override {
    std::vector<int64_t> out_splits(recv_counts.begin(), recv_counts.end());
    std::vector<int64_t> in_splits(send_counts.begin(), send_counts.end());
    return Guarded(fmt::format("tensor-parallel all-to-all of rank {} of {}", rank_, size_), [&] {
      at::Tensor out = Bytes(recv.data(), recv.size());
      at::Tensor in = Bytes(send.data(), send.size());
      // No timeout here: Gloo's own (Options) ends the op, and only then may the buffers, which
      // it does not own, be freed.
      group_->alltoall_base(out, in, out_splits, in_splits)->wait();
      for (uint64_t c : recv_counts) received_ += c;
      return Status::OK();
    });
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_;
  int size_;
  uint64_t received_ = 0;
};

class GlooGroups : public ProcessGroups {
 public:
  GlooGroups(GroupOptions options, c10::intrusive_ptr<c10d::ProcessGroupGloo> world,
             std::unique_ptr<GlooExchange> tp)
      : options_(std::move(options)), world_(std::move(world)), tp_(std::move(tp)) {}

  Exchange& exchange() override { return *tp_; }
  const GroupOptions& options() const override { return options_; }
  uint64_t received() const { return tp_->received(); }

  Status Broadcast(std::span<std::byte> data, int root) override {
    return Guarded(fmt::format("rank {} in a broadcast from rank {}", options_.rank, root), [&] {
      std::vector<at::Tensor> tensors = {Bytes(data.data(), data.size())};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      world_->broadcast(tensors, o)->wait();  // Gloo's timeout bounds it
      return Status::OK();
    });
  }

  Result<std::vector<uint64_t>> AllGather(uint64_t value) override {
    return Guarded(fmt::format("rank {} waiting for the other {} ranks", options_.rank,
                               options_.world_size - 1),
                   [&]() -> Result<std::vector<uint64_t>> {
                     std::vector<at::Tensor> in = {torch::tensor(
                         {static_cast<int64_t>(value)}, torch::kInt64)};
                     std::vector<std::vector<at::Tensor>> out(1);
                     for (int r = 0; r < options_.world_size; ++r) {
                       out[0].push_back(torch::empty({1}, torch::kInt64));
                     }
                     world_->allgather(out, in)->wait();  // Gloo's timeout bounds it
                     std::vector<uint64_t> values;
                     for (const at::Tensor& t : out[0]) {
                       values.push_back(static_cast<uint64_t>(t.item<int64_t>()));
                     }
                     return values;
                   });
  }

 private:
  GroupOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> world_;
  std::unique_ptr<GlooExchange> tp_;
};

Result<int> EnvInt(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  int value = 0;
  const std::string_view s(text);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < lo || value > hi) {
    return Status::InvalidArgument(fmt::format(
        "environment variable {}='{}' is not a number from {} to {}", name, s, lo, hi));
  }
  return value;
}

// FNV-1a over values.
class Hash {
 public:
  void Mix(const void* data, size_t n) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ bytes[i]) * 1099511628211ULL;
  }
  void Mix(uint64_t v) { Mix(&v, sizeof v); }
  void Mix(std::string_view s) { Mix(s.data(), s.size()), Mix(s.size()); }
  // Never 0 (0 says "failed" in the all-gathers below), and fits an int64.
  uint64_t value() const { return (h_ >> 1) | 1; }

 private:
  uint64_t h_ = 1469598103934665603ULL;
};

// What every rank must agree on before it reads: each tensor's name, dtype, shape and offset.
uint64_t CatalogHash(const Checkpoint& checkpoint) {
  Hash h;
  for (const TensorInfo& t : checkpoint.tensors()) {
    h.Mix(t.name);
    h.Mix(static_cast<uint64_t>(t.dtype));
    for (uint64_t d : t.shape) h.Mix(d);
    h.Mix(t.offset);
    h.Mix(t.nbytes);
  }
  return h.value();
}

// ... and before it exchanges: every tensor's split, the buckets and the dtypes loaded (a rank
// with another --tp-plan, config.json, --dtype or bucket size would send what others do not
// expect).
uint64_t SplitHash(const RankShare& share, const LoadPlan& plan) {
  Hash h;
  h.Mix(share.options.bucket_bytes);
  h.Mix(share.expert_bytes);
  // One expert's tensors differ between the ranks (each holds its own) and are never exchanged.
  std::unordered_set<std::string_view> experts;
  for (const TensorShard& s : share.tensors) {
    if (s.dim < 0 && s.style == "grouped_gemm") experts.insert(s.name);
  }
  for (const TensorShard& s : share.tensors) {
    if (experts.count(s.name) > 0) continue;
    h.Mix(s.name);
    h.Mix(static_cast<uint64_t>(s.dim + 1));
    h.Mix(static_cast<uint64_t>(s.exchanged));
    for (const auto& cut : s.cuts) {
      for (const auto& [lo, hi] : cut) h.Mix(lo), h.Mix(hi);
    }
  }
  std::set<uint64_t> expert_dtypes;  // what every rank's experts load as (the --dtype rules)
  for (const TensorPlan& t : plan.tensors) {
    if (experts.count(share.reads.tensors()[t.source].name) > 0) {
      expert_dtypes.insert(static_cast<uint64_t>(t.dtype));
      continue;
    }
    h.Mix(share.reads.tensors()[t.source].name);
    h.Mix(static_cast<uint64_t>(t.dtype));
  }
  for (uint64_t d : expert_dtypes) h.Mix(d);
  return h.value();
}

// The parallel layout every rank must share.
uint64_t LayoutHash(const ParallelOptions& par) {
  Hash h;
  h.Mix(static_cast<uint64_t>(par.world_size));
  h.Mix(static_cast<uint64_t>(par.tp));
  h.Mix(static_cast<uint64_t>(par.pp));
  for (int n : par.pp_layers) h.Mix(static_cast<uint64_t>(n));
  h.Mix(par.bucket_bytes);
  h.Mix(static_cast<uint64_t>(par.read_mode));
  h.Mix(static_cast<uint64_t>(par.expert_parallel));
  return h.value();
}

}  // namespace

Result<GroupOptions> GroupOptionsFromEnvironment(GroupOptions o) {
  LOADSTONE_ASSIGN_OR_RETURN(o.world_size, EnvInt("WORLD_SIZE", o.world_size, 1, 1 << 20));
  LOADSTONE_ASSIGN_OR_RETURN(o.rank, EnvInt("RANK", o.rank, 0, (1 << 20) - 1));
  LOADSTONE_ASSIGN_OR_RETURN(o.master_port, EnvInt("MASTER_PORT", o.master_port, 1, 65535));
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
    o.master_addr = addr;
  }
  return o;
}

Result<std::unique_ptr<ProcessGroups>> ProcessGroups::Connect(const GroupOptions& options,
                                                              int tp) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size ||
      tp < 1 || options.world_size % tp != 0) {
    return Status::InvalidArgument(fmt::format(
        "rank {} of a world of {} in tensor-parallel groups of {}: a rank is 0 .. world size - 1 "
        "and the degree divides the world size",
        options.rank, options.world_size, tp));
  }
  const std::string where = fmt::format("rank {} of {} meeting at {}:{}", options.rank,
                                        options.world_size, options.master_addr,
                                        options.master_port);
  return Guarded(where, [&]() -> Result<std::unique_ptr<ProcessGroups>> {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port);
    store_options.isServer = options.rank == 0;
    store_options.numWorkers = options.world_size;
    store_options.timeout = options.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    auto world = NewGloo(c10::make_intrusive<c10d::PrefixStore>("world", store), options.rank,
                         options.world_size, options);
    const int group = options.rank / tp;
    auto tp_group = NewGloo(
        c10::make_intrusive<c10d::PrefixStore>(fmt::format("tp{}", group), store),
        options.rank % tp, tp, options);
    auto exchange =
        std::make_unique<GlooExchange>(std::move(tp_group), options.rank % tp, tp);
    return std::unique_ptr<ProcessGroups>(
        std::make_unique<GlooGroups>(options, std::move(world), std::move(exchange)));
  });
}

Result<RankLoad> LoadRank(Loader& loader, const Checkpoint& checkpoint,
                          const ParallelOptions& par, const PlanOptions& options,
                          ProcessGroups& groups) {
  LOADSTONE_RETURN_IF_ERROR(Agree(groups, Status::OK(), CatalogHash(checkpoint),
                                  "checkpoint (its tensors' names, dtypes, shapes or offsets)"));
  LOADSTONE_RETURN_IF_ERROR(
      Agree(groups, Status::OK(), LayoutHash(par),
            "parallel layout (--tp, --pp, --pp-layers, --ep, --read-mode, bucket size)"));
  ParallelOptions first = par;
  if (par.read_mode == ReadMode::kAuto) first.read_mode = ReadMode::kEachRank;
  Result<RankShare> share = ShareOf(checkpoint, first);
  Result<LoadPlan> plan = share.ok() ? Plan(share->reads, RankPlanOptions(options))
                                     : Result<LoadPlan>(share.status());
  Status planned = plan.ok() ? CheckOnCpu(*plan) : plan.status();
  LOADSTONE_RETURN_IF_ERROR(Agree(
      groups, planned, planned.ok() ? SplitHash(*share, *plan) : 0,
      "tensor-parallel split (from --tp-plan, --ep-plan or config.json, --dtype and the bucket "
      "size)", &par));
  dist::ReadModeChoice choice;
  if (par.read_mode == ReadMode::kAuto) {
    LOADSTONE_ASSIGN_OR_RETURN(choice, dist::ChooseReadMode(loader, *share, options, groups));
    Status replanned = Status::OK();
    if (choice.mode == ReadMode::kOnce) {
      first.read_mode = ReadMode::kOnce;
      share = ShareOf(checkpoint, first);
      plan = share.ok() ? Plan(share->reads, RankPlanOptions(options))
                        : Result<LoadPlan>(share.status());
      replanned = plan.status();
    }
    // Every rank, whatever its group chose: the world's collectives stay the same sequence.
    LOADSTONE_RETURN_IF_ERROR(Agree(groups, replanned, 1, "planning the mode auto chose"));
  }
  const auto start = Clock::now();
  LoadHandle handle = loader.Load(share->reads, *plan);
  const Status status = handle.Done().get();
  const auto loaded = Clock::now();
  // Every rank says whether it has its share before any waits in an exchange for a rank that
  // will never come.
  LOADSTONE_RETURN_IF_ERROR(Agree(groups, status, 1, "loading its share"));
  auto* gloo = dynamic_cast<GlooGroups*>(&groups);
  const uint64_t before = gloo != nullptr ? gloo->received() : 0;
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<Tensor> tensors,
                             AssembleShare(*share, handle.Tensors(), &groups.exchange()));
  RankLoad out{std::move(*share), std::move(*plan), std::move(tensors), handle.read_stats()};
  out.received_bytes = gloo != nullptr ? gloo->received() - before : 0;
  out.load_seconds = std::chrono::duration<double>(loaded - start).count();
  out.exchange_seconds = std::chrono::duration<double>(Clock::now() - loaded).count();
  out.share.options.read_mode = par.read_mode;  // as asked; share.read_mode: as taken
  out.measured_read_bytes_per_s = choice.read_bytes_per_s;
  out.measured_link_bytes_per_s = choice.link_bytes_per_s;
  out.read_mode_cost = choice.cost;
  out.probe_bytes = choice.probe_bytes;
  return out;
}

}  // namespace loadstone

extern "C" const loadstone::DistApi* loadstone_dist_api() {
  static const loadstone::DistApi api{loadstone::kDistApiVersion,
                                      &loadstone::GroupOptionsFromEnvironment,
                                      &loadstone::ProcessGroups::Connect, &loadstone::LoadRank};
  return &api;
}
