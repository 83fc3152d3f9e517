// loadstone load PATH [plan flags] [read flags] [--json] [--trace FILE]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/offload.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/load_rank.h"
#include "tools/loadstone/plan_flags.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {
namespace {

struct LoadArgs {
  PlanFlags flags;
  ReadFlags read;
  RankFlags rank;
  bool json = false;
  std::string trace;
  bool trace_given = false;  // --trace was given, perhaps as ''
  bool overwrite = false;
  bool cache = false;     // --cache, or --cache-dir given
  std::string cache_dir;  // empty: huggingface_hub's
};

// The trace file must be writable before the load starts, not found unwritable at its end; an
// existing one is replaced only with --overwrite. Nothing is created here: the trace appears,
// whole, when the load has ended (LoadHandle::WriteTrace).
Status CheckTraceTarget(const std::string& path, bool overwrite) {
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return Status::InvalidArgument(fmt::format(
          "--trace {}: it is not a regular file: it is left as it is; give a file's path", path));
    }
    if (!overwrite) {
      return Status::InvalidArgument(fmt::format(
          "--trace {}: the file exists: it is left as it is; give a new path, or --overwrite to "
          "replace it",
          path));
    }
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0) {
    return Status::IOError(fmt::format("--trace {}: cannot write there ({}); give a path you "
                                       "can write to",
                                       path, std::strerror(errno)));
  }
  return Status::OK();
}

// "1.30 GiB read at 1.82 GB/s" or, for a mapped load, what was mapped and what was read.
std::string HowBytesCame(const Progress& p, const ReadStats& rs) {
  const double gbps = p.seconds > 0 ? p.bytes_read / p.seconds / 1e9 : 0;
  std::string out;
  if (const uint64_t mapped = rs.taken(ReadRoute::kMapped).bytes; mapped > 0) {
    out = fmt::format("{} mapped (read from the file on first touch, not now), ",
                      HumanBytes(mapped));
  }
  return out + fmt::format("{} read at {:.2f} GB/s", HumanBytes(p.bytes_read), gbps);
}

// The offloaded tensors: where each is (NAME.dat or in place) and its CRC-32 there.
Result<nlohmann::ordered_json> OffloadedJson(const Checkpoint& checkpoint, const LoadPlan& plan,
                                             Loader& loader) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (plan.offloaded.empty()) return out;
  // Each offloaded tensor materialised on the CPU once, for its CRC: what a reload gives. One
  // load per tensor, not one for all: the disk set is what did not fit in memory.
  auto store = OffloadStore::Open(std::shared_ptr<Loader>(&loader, [](Loader*) {}), checkpoint, plan);
  if (!store.ok()) return store.status();
  for (const OffloadPlan& o : plan.offloaded) {
    const TensorInfo& t = checkpoint.tensors()[o.source];
    LOADSTONE_ASSIGN_OR_RETURN(const std::string where, (*store)->Where(t.name));
    auto handle = (*store)->Fetch({t.name}, Device::Cpu());
    if (!handle.ok()) return handle.status();
    LOADSTONE_RETURN_IF_ERROR(handle->Done().get());
    LOADSTONE_ASSIGN_OR_RETURN(const uint32_t crc, Crc32(handle->Tensor(t.name).get()));
    out.push_back({{"name", t.name},
                   {"dtype", SafetensorsName(o.dtype)},
                   {"shape", o.shape},
                   {"device", "disk"},
                   {"in_place", o.in_place},
                   {"where", where},
                   {"crc32", crc}});
  }
  return out;
}

// When each step of the command happened, in milliseconds from the Open call (the clock's
// making): how long opening the checkpoint (its headers, the catalog) and planning took, and when
// each tensor came into memory. Thread-safe.
class LoadClock {
 public:
  double Now() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }
  // For LoadOptions::on_tensor; the clock must outlive the load.
  std::function<void(const loadstone::Tensor&)> OnTensor() {
    return [this](const loadstone::Tensor& t) {
      const double now = Now();
      std::lock_guard lock(mu_);
      ready_ms_[t.name()] = now;
      if (!first_ms_) first_ms_ = now;
    };
  }
  // When tensor `name` was in place; none when it did not go to memory.
  std::optional<double> ready_ms(const std::string& name) const {
    std::lock_guard lock(mu_);
    const auto it = ready_ms_.find(name);
    return it == ready_ms_.end() ? std::nullopt : std::optional<double>(it->second);
  }
  // When the first tensor was; none when no tensor went to memory (every one to disk).
  std::optional<double> first_ms() const {
    std::lock_guard lock(mu_);
    return first_ms_;
  }
  double open_ms = 0;  // Checkpoint::Open (with the flags' resolution)
  double plan_ms = 0;  // Plan()

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::unordered_map<std::string, double> ready_ms_;
  std::optional<double> first_ms_;
};

// What the offload did after the load: the folder's files written, the bytes read to write them.
struct OffloadDone {
  OffloadSummary summary;
  double seconds = 0;
};

int PrintJson(const LoadHandle& load, const LoadPlan& plan, const Platform& platform,
              const LoadClock& clock, const OffloadDone& offload,
              const nlohmann::ordered_json& offloaded, const std::vector<std::string>& warnings) {
  const Progress progress = load.progress();
  const ReadStats rs = load.read_stats();
  const double seconds = progress.seconds;
  nlohmann::ordered_json doc;
  doc["bytes"] = plan.read_bytes;
  doc["read_bytes"] = progress.bytes_read;
  doc["mapped_bytes"] = rs.taken(ReadRoute::kMapped).bytes;
  doc["placed_bytes"] = plan.placed_bytes;
  doc["seconds"] = seconds;
  doc["gbps"] = seconds > 0 ? progress.bytes_read / seconds / 1e9 : 0;
  doc["backend"] = load.backend();
  doc["platform"] = platform.description();
  doc["simulated"] = platform.simulated();
  doc["open_ms"] = clock.open_ms;
  doc["plan_ms"] = clock.plan_ms;
  const std::optional<double> first_ms = clock.first_ms();
  doc["first_tensor_ms"] = first_ms ? nlohmann::ordered_json(*first_ms) : nullptr;
  doc["read"] = {{"direct_bytes", rs.direct_bytes},
                 {"buffered_bytes", rs.buffered_bytes},
                 {"bounced_bytes", rs.bounced_bytes},
                 {"resubmits", rs.resubmits},
                 {"network_bytes", rs.network_bytes},
                 {"cache_copied_bytes", rs.taken(ReadRoute::kPageCacheCopy).bytes},
                 {"mapped_bytes", rs.taken(ReadRoute::kMapped).bytes},
                 {"conversions_moved", rs.conversions_moved},
                 {"cache", rs.cache.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(rs.cache)}};
  // The route each read took (the plan's, settled as each read's turn came: routes.h).
  doc["routes"] = RoutesJson(rs.routes);
  std::map<std::string, uint64_t> per_device;
  auto& tensors = doc["tensors"] = nlohmann::ordered_json::array();
  for (const loadstone::Tensor& t : load.Tensors()) {
    auto crc = Crc32(t);
    if (!crc.ok()) return ReportError(crc.status());
    per_device[t.device()] += t.nbytes();
    tensors.push_back({{"name", t.name()},
                       {"dtype", SafetensorsName(t.dtype())},
                       {"shape", t.shape()},
                       {"device", t.device()},
                       {"crc32", *crc},
                       {"ready_ms", clock.ready_ms(t.name()).value_or(0)}});
  }
  auto& devices = doc["devices"] = nlohmann::ordered_json::object();
  for (const auto& [device, bytes] : per_device) {
    devices[device] = {{"bytes", bytes}, {"gbps", seconds > 0 ? bytes / seconds / 1e9 : 0}};
  }
  if (!plan.offloaded.empty()) devices["disk"] = {{"bytes", plan.offloaded_bytes}};
  doc["offload_folder"] = plan.offload_folder;
  doc["offload"] = {{"read_bytes", offload.summary.bytes_read},
                    {"written_files", offload.summary.written},
                    {"written_bytes", offload.summary.bytes_written},
                    {"in_place", offload.summary.in_place},
                    {"seconds", offload.seconds}};
  doc["offloaded"] = offloaded;
  doc["warnings"] = warnings;
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

// What the command loads, resolved: the flags' input, its plan, how to read it, and every
// warning (the flags', then the plan's).
struct LoadSetup {
  PlanInput in;
  LoadPlan plan;
  LoaderOptions loader_options;
  std::vector<std::string> warnings;
};

// Resolves the flags and plans; prints the warnings (and with --explain the plan's reasons) on
// stderr; checks the --trace target. The first error met, in that order.
Result<LoadSetup> Prepare(const LoadArgs& args, LoadClock& clock) {
  LOADSTONE_ASSIGN_OR_RETURN(PlanInput in, args.flags.Resolve("cpu"));
  clock.open_ms = clock.Now();
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(*in.checkpoint, in.options));
  clock.plan_ms = clock.Now() - clock.open_ms;
  // The flags' warnings, then the plan's: on stderr, and in the document's "warnings".
  std::vector<std::string> warnings = in.warnings;
  LOADSTONE_ASSIGN_OR_RETURN(LoaderOptions loader_options,
                             args.read.ToLoaderOptions(in.options.platform, &warnings));
  if (args.trace_given && args.trace.empty()) {
    warnings.push_back("--trace '': no file named, so no trace is written");
  }
  warnings.insert(warnings.end(), plan.warnings.begin(), plan.warnings.end());
  PrintWarnings(warnings);
  if (in.options.explain) {
    for (const std::string& line : plan.devices.explanation) std::cerr << "plan: " << line << "\n";
  }
  if (!args.trace.empty()) LOADSTONE_RETURN_IF_ERROR(CheckTraceTarget(args.trace, args.overwrite));
  return LoadSetup{std::move(in), std::move(plan), std::move(loader_options),
                   std::move(warnings)};
}

// The disk tensors written to the offload folder (those not read in place), timed; Cancelled
// when `interrupt` asks.
Result<OffloadDone> WriteOffloadTimed(Loader& loader, const Checkpoint& checkpoint,
                                      const LoadPlan& plan, const InterruptToCancel& interrupt) {
  OffloadOptions offload;
  offload.cancelled = [&interrupt] { return interrupt.interrupted(); };
  const auto offload_start = std::chrono::steady_clock::now();
  LOADSTONE_ASSIGN_OR_RETURN(OffloadSummary written,
                             WriteOffload(loader, checkpoint, plan, offload));
  return OffloadDone{written, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                            offload_start)
                                  .count()};
}

// The human report on stdout: what was loaded and how, what went to disk, the simulated devices.
void PrintHuman(const LoadHandle& load, const Progress& progress, const LoadPlan& plan,
                const PlanOptions& options, std::optional<double> first_ms,
                const OffloadDone& offloaded_now) {
  std::cout << fmt::format(
      "loaded {} tensors into memory in {:.3f} s: {}; {} placed; {}\n"
      "backend: {}\n"
      "read: {}\n",
      progress.tensors_total, progress.seconds, HowBytesCame(progress, load.read_stats()),
      HumanBytes(plan.placed_bytes),
      first_ms ? fmt::format("first tensor after {:.1f} ms", *first_ms)
               : std::string("no tensor goes to memory"),
      load.backend(), ReadSources(load.read_stats()));
  if (!load.read_stats().cache.empty()) std::cout << "cache: " << load.read_stats().cache << "\n";
  if (!plan.offloaded.empty()) {
    const OffloadSummary& w = offloaded_now.summary;
    std::cout << fmt::format(
        "disk: {} tensors, {}: {} read in place from their safetensors file, {} written to {}{}\n",
        plan.offloaded.size(), HumanBytes(plan.offloaded_bytes), w.in_place, w.written,
        w.index_path.empty() ? "(no folder)" : w.index_path,
        w.written > 0 ? fmt::format(" ({} read, {} written in {:.3f} s)", HumanBytes(w.bytes_read),
                                    HumanBytes(w.bytes_written), offloaded_now.seconds)
                      : "");
  }
  if (options.platform && options.platform->simulated()) {
    std::cout << "devices: " << options.platform->description()
              << " (host memory behind the device interface)\n";
  }
}

// What a tensor- or pipeline-parallel load does not do yet, asked for.
Status RankRefusal(const LoadArgs& args) {
  if (args.cache) {
    return Status::Unsupported(
        "--cache with a tensor- or pipeline-parallel load: not yet; fill the cache with a load "
        "of one rank first");
  }
  if (args.trace_given) {
    return Status::Unsupported(
        "--trace with a tensor-parallel load (--tp, --world-size, --rank): not yet; trace a "
        "load of one rank without them");
  }
  return Status::OK();
}

int RunLoad(const LoadArgs& args) {
  if (args.rank.dist_only_given && !args.rank.asked()) {
    return ReportError(Status::InvalidArgument(
        "--master, --tp-plan, --ep, --ep-plan, --pp-layers, --read-mode and --dist-timeout belong "
        "to a tensor- or pipeline-parallel load: give --tp or --pp (and --world-size / --rank, or "
        "run the ranks with loadstone launch -n N)"));
  }
  if (args.rank.asked()) {
    if (Status refused = RankRefusal(args); !refused.ok()) return ReportError(refused);
    return RunRankLoad(args.flags, args.read, args.rank, args.json);
  }
  LoadClock clock;  // from the Open call
  auto setup = Prepare(args, clock);
  if (!setup.ok()) return ReportError(setup.status());
  const Checkpoint& checkpoint = *setup->in.checkpoint;
  const PlanOptions& plan_options = setup->in.options;
  const LoadPlan& plan = setup->plan;

  Loader loader(setup->loader_options);
  LoadOptions options;
  options.trace = !args.trace.empty();
  options.on_tensor = clock.OnTensor();
  if (args.cache) options.hub_cache = args.cache_dir;
  InterruptToCancel interrupt;
  LoadHandle load = loader.Load(checkpoint, plan, options);
  const WaitResult wait =
      WaitWithProgress(load, /*show=*/!args.json && ::isatty(STDERR_FILENO), &interrupt);
  const Progress progress = load.progress();
  if (!args.trace.empty()) {
    if (Status s = load.WriteTrace(args.trace); !s.ok()) return ReportError(s);
  }
  if (wait.interrupted && wait.status.code() == StatusCode::kCancelled) {
    std::cerr << CancelledLine(progress)
              << (args.trace.empty() ? "" : fmt::format("; trace written to {}", args.trace))
              << "\n";
    return 130;
  }
  if (!wait.status.ok()) return ReportError(wait.status);
  auto written = WriteOffloadTimed(loader, checkpoint, plan, interrupt);
  if (!written.ok() && written.status().code() == StatusCode::kCancelled && interrupt.interrupted()) {
    std::cerr << "cancelled (Ctrl-C) while writing the offload folder: the .dat files written are "
                 "removed and index.json is as it was\n";
    return 130;
  }
  if (!written.ok()) return ReportError(written.status());

  if (args.json) {
    auto offloaded = OffloadedJson(checkpoint, plan, loader);
    if (!offloaded.ok()) return ReportError(offloaded.status());
    return PrintJson(load, plan, plan_options.platform ? *plan_options.platform
                                                       : *Platform::Default(),
                     clock, *written, *offloaded, setup->warnings);
  }
  PrintHuman(load, progress, plan, plan_options, clock.first_ms(), *written);
  return 0;
}

}  // namespace

void AddLoadCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LoadArgs>();
  CLI::App* cmd = app.add_subcommand("load", "Stream a checkpoint into memory");
  args->flags.Register(cmd, /*path_required=*/true);
  args->read.Register(cmd);
  args->rank.Register(cmd);
  cmd->add_flag("--json", args->json, "Print one JSON document (with CRC-32 per tensor)");
  cmd->add_option("--trace", args->trace,
                  "Write a Chrome trace-event JSON of the load (open it in Perfetto)")
      ->each([args](const std::string&) { args->trace_given = true; });
  cmd->add_flag("--overwrite", args->overwrite, "Replace an existing --trace file");
  cmd->add_flag("--cache", args->cache,
                "Write what streams from an hf:// address into the Hugging Face cache too "
                "(HF_HUB_CACHE, else ~/.cache/huggingface/hub)");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "The cache folder for --cache (implies it), read first as the default one is")
      ->each([args](const std::string& dir) {
        args->cache = true;
        args->flags.open.hub_cache = dir;  // the cache written is the one read
      });
  cmd->callback([args, exit_code] { *exit_code = RunLoad(*args); });
}

}  // namespace loadstone::cli
