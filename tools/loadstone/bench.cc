// loadstone bench PATH [--cold] [--repeat N] [--peers CMD] [--json]: loadstone against baselines
// and peers, interleaved in one run.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/loadstone/bench_methods.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/parse.h"
#include "tools/loadstone/plan_flags.h"

namespace loadstone::cli {
namespace {

struct BenchArgs {
  PlanFlags flags;
  ReadFlags read;
  bool cold = false;
  bool json = false;
  int repeat = 3;
  std::string convert_to = "f32";
  std::string peers;  // external peer program (argv prefix, split at spaces); empty: none
  double settle_seconds = 2;
  std::optional<uint64_t> seed;  // of the per-round method order; random when unset
};

std::vector<std::string> SplitWords(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// True for a checkpoint behind addresses (http(s), s3, the Hub): its files are not on this
// machine, so the methods that read local files do not apply.
bool Remote(const Checkpoint& ckpt) {
  return !ckpt.files().empty() && ckpt.files().front().path.find("://") != std::string::npos;
}

// The methods: loadstone, its first-touch bound and its cast; for local files also the pread
// backend and the baselines that read the files themselves.
std::vector<BenchMethod> Methods(const Checkpoint& ckpt, const BenchArgs& args,
                                 const PlanOptions& plan, const LoaderOptions& loader,
                                 DType convert_to) {
  std::vector<BenchMethod> methods;
  methods.push_back({"loadstone", BenchMethod::Kind::kLoadstone, plan, loader});
  methods.push_back({"first-touch", BenchMethod::Kind::kFirstTouch, plan, {}});
  const bool local = !Remote(ckpt);
  LoaderOptions pread = loader;
  pread.backend = ReadBackend::kPread;
  if (local) methods.push_back({"loadstone-pread", BenchMethod::Kind::kLoadstone, plan, pread});
  bool has_bf16 = false;
  for (const TensorInfo& t : ckpt.tensors()) has_bf16 |= t.dtype == DType::kBF16;
  if (has_bf16 && !plan.dtype) {
    PlanOptions cast = plan;
    cast.dtype = convert_to;
    methods.push_back(
        {"loadstone-bf16-to-" + args.convert_to, BenchMethod::Kind::kLoadstone, cast, loader});
    methods.push_back({"first-touch-" + args.convert_to, BenchMethod::Kind::kFirstTouch, cast, {}});
  }
  if (!local) return methods;
  methods.push_back({"read-per-tensor", BenchMethod::Kind::kReadPerTensor, {}, {}});
  methods.push_back({"mmap-memcpy", BenchMethod::Kind::kMmapMemcpy, {}, {}});
  methods.push_back({"raw-ceiling", BenchMethod::Kind::kRawCeiling, {}, {}});
  return methods;
}

// The human report: one row a method (its backend on the line below), then each ratio with
// what it compares, each bound labelled for what it bounds. Fits 80 columns but for paths.
void PrintTable(const nlohmann::ordered_json& doc, const nlohmann::ordered_json& results,
                const nlohmann::ordered_json& ratios, const BenchArgs& args) {
  const bool cold = args.cold;
  std::cout << fmt::format("{} bench of {} ({}), median of {} run(s):\n",
                           doc["mode"].get<std::string>(), args.flags.path,
                           HumanBytes(doc["bytes"].get<uint64_t>()), args.repeat);
  std::cout << fmt::format("  {:<34} {:>8} {:>10} {:>12}\n", "method", "GB/s", "median s",
                           "peak RSS");
  for (const auto& r : results) {
    const std::string method = r["method"].get<std::string>();
    if (r.contains("error")) {
      std::cout << fmt::format("  {:<34} failed: {}\n", method, r["error"].get<std::string>());
      continue;
    }
    std::vector<double> runs = r["seconds"].get<std::vector<double>>();
    std::cout << fmt::format("  {:<34} {:>8.2f} {:>10.3f} {:>12}\n", method,
                             r["gbps"].get<double>(), runs.empty() ? 0.0 : Median(runs),
                             HumanBytes(r["peak_rss_bytes"].get<uint64_t>()));
    if (const std::string backend = r["backend"].get<std::string>(); backend != method) {
      std::cout << Wrapped(backend, 79, "      ");
    }
  }
  std::cout << "ratios (loadstone's GB/s over theirs; above 1 is faster):\n";
  auto row = [](const std::string& what, const nlohmann::ordered_json& value) {
    if (!value.is_number()) return;
    std::cout << fmt::format("  {:<66} {:>8.2f}x\n", what, value.get<double>());
  };
  row(fmt::format("machine bound: {}", ratios["machine_bound"].get<std::string>() == "raw-ceiling"
                                           ? "the device (O_DIRECT raw ceiling)"
                                           : "first touch (writing fresh pages)"),
      ratios["loadstone_vs_machine_bound"]);
  row(cold ? "raw ceiling: the device read with O_DIRECT (bounds a cold load)"
           : "raw ceiling: the device with O_DIRECT (no bound: files are cached)",
      ratios["loadstone_vs_raw_ceiling"]);
  row(fmt::format("best baseline ({})", ratios["best_baseline"].get<std::string>()),
      ratios["loadstone_vs_best_baseline"]);
  row(fmt::format("best doing the same work ({})", ratios["best_same_work"].get<std::string>()),
      ratios["loadstone_vs_best_same_work"]);
  if (ratios.contains("loadstone_vs_peer")) {
    for (const auto& [peer, value] : ratios["loadstone_vs_peer"].items()) {
      if (value.is_null()) {
        std::cout << fmt::format("  peer {:<61} {:>9}\n", peer, "failed");
      } else {
        row("peer " + peer, value);
      }
    }
  }
  if (ratios.contains("conversion_vs_plain")) {
    std::cout << fmt::format("conversion to {} (its GB/s over the other's):\n", args.convert_to);
    row("the same load without the cast", ratios["conversion_vs_plain"]);
    row("first touch of the cast's output", ratios["conversion_vs_first_touch"]);
  }
  std::cout << fmt::format("  {:<66} {:>8.2f}x\n", "loadstone's peak RSS over the checkpoint's bytes",
                           ratios["loadstone_peak_rss_over_bytes"].get<double>());
}

// What the command runs: the resolved flags (the checkpoint, its plan options) and the methods.
struct BenchSetup {
  PlanInput input;
  std::vector<BenchMethod> methods;
};

// Resolves the flags, checks that the checkpoint plans, prints the warnings, and lists the
// methods (peers last); the first error met, in that order.
Result<BenchSetup> Prepare(const BenchArgs& args) {
  LOADSTONE_ASSIGN_OR_RETURN(PlanInput in, args.flags.Resolve("cpu"));
  const PlanOptions& plan = in.options;
  LOADSTONE_ASSIGN_OR_RETURN(LoaderOptions loader,
                             args.read.ToLoaderOptions(plan.platform, &in.warnings));
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan checked, Plan(*in.checkpoint, plan));
  PrintWarnings(in.warnings);
  PrintWarnings(checked.warnings);
  LOADSTONE_ASSIGN_OR_RETURN(DType convert_to, ParseCastTarget(args.convert_to, "--convert-to"));
  if (Remote(*in.checkpoint) && (args.cold || !args.peers.empty())) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is remote: {} apply to local files only (a remote checkpoint's cache is the "
        "server's; the peers read files); bench it without them",
        args.flags.path, args.cold ? "--cold and its page-cache drops" : "--peers"));
  }
  auto methods = Methods(*in.checkpoint, args, plan, loader, convert_to);
  if (!args.peers.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(auto peers, ListExternalPeers(SplitWords(args.peers)));
    methods.insert(methods.end(), peers.begin(), peers.end());
  }
  return BenchSetup{std::move(in), std::move(methods)};
}

// What the rounds measured, by method name; a method not measured reads as empty or zero.
struct Measurements {
  std::map<std::string, std::vector<double>> seconds;
  std::map<std::string, uint64_t> peak_rss;
  std::map<std::string, std::string> backends;
  std::map<std::string, double> resident_before;
  std::map<std::string, std::string> errors;  // a peer that fails is reported, not retried
  double bytes = 0;                           // the checkpoint's

  // GB/s of `name`'s median run; 0 when it has none.
  double Gbps(const std::string& name) const {
    const auto runs = Find(seconds, name);
    return runs.empty() ? 0.0 : bytes / Median(runs) / 1e9;
  }

  // map[name], or a value-initialized T when absent.
  template <typename T>
  static T Find(const std::map<std::string, T>& map, const std::string& name) {
    const auto it = map.find(name);
    return it == map.end() ? T{} : it->second;
  }
};

// One run of `m` in round `round` (from 0): after the settle time, with the page cache made cold
// or warm, its time, peak RSS and backend recorded (a failed peer: its error, reported on stderr
// unless --json). The error of anything else that fails.
Status RunOnce(const BenchArgs& args, const Checkpoint& ckpt, const BenchMethod& m, int round,
               Measurements& measured) {
  // The previous child's memory is still being handed back (on a VM with free-page
  // reporting, for seconds): let it settle, so that every run starts alike.
  std::this_thread::sleep_for(std::chrono::duration<double>(args.settle_seconds));
  // Cold: nothing of the files in the page cache; warm: all of them (an O_DIRECT run
  // before leaves nothing there).
  if (!Remote(ckpt)) {
    LOADSTONE_RETURN_IF_ERROR(args.cold ? DropFromPageCache(ckpt) : WarmPageCache(ckpt));
    measured.resident_before[m.name] =
        std::max(measured.resident_before[m.name], ResidentFraction(ckpt));
  }
  auto run = RunMethod(m, ckpt);
  if (!run.ok() && m.kind == BenchMethod::Kind::kExternal) {
    const std::string& error = measured.errors[m.name] = run.status().message();
    if (!args.json) std::cerr << fmt::format("  peer {} failed: {}\n", m.name, error);
    return Status::OK();
  }
  if (!run.ok()) return run.status();
  measured.seconds[m.name].push_back(run->seconds);
  measured.peak_rss[m.name] = std::max(measured.peak_rss[m.name], run->peak_rss_bytes);
  measured.backends[m.name] = run->backend;
  if (!args.json) {
    std::cerr << fmt::format("  run {} {:<34} {:7.3f} s  {:6.2f} GB/s\n", round + 1, m.name,
                             run->seconds, ckpt.total_bytes() / run->seconds / 1e9);
  }
  return Status::OK();
}

// --repeat rounds of every method, interleaved, so that drift hits every method alike, in a
// fresh random order (from `seed`) each round, so that no method keeps one predecessor (whose
// freed memory the VM may still be handing back) for the whole run. Each round's order is
// appended to `order`; a peer that failed is not run again.
Status RunRounds(const BenchArgs& args, const Checkpoint& ckpt,
                 const std::vector<BenchMethod>& methods, uint64_t seed,
                 nlohmann::ordered_json& order, Measurements& measured) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> shuffled(methods.size());
  std::iota(shuffled.begin(), shuffled.end(), size_t{0});
  for (int r = 0; r < args.repeat; ++r) {
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    auto& names = order.emplace_back(nlohmann::ordered_json::array());
    for (size_t i : shuffled) names.push_back(methods[i].name);
    for (size_t i : shuffled) {
      if (measured.errors.count(methods[i].name)) continue;
      LOADSTONE_RETURN_IF_ERROR(RunOnce(args, ckpt, methods[i], r, measured));
    }
  }
  return Status::OK();
}

// The "results" array: one entry a method, in the methods' order.
nlohmann::ordered_json Results(const std::vector<BenchMethod>& methods,
                               const Measurements& measured) {
  auto results = nlohmann::ordered_json::array();
  for (const BenchMethod& m : methods) {
    nlohmann::ordered_json r = {
        {"method", m.name},
        {"backend", Measurements::Find(measured.backends, m.name)},
        {"seconds", Measurements::Find(measured.seconds, m.name)},
        {"gbps", measured.Gbps(m.name)},
        {"peak_rss_bytes", Measurements::Find(measured.peak_rss, m.name)},
        {"page_cache_resident_before", Measurements::Find(measured.resident_before, m.name)}};
    if (m.kind == BenchMethod::Kind::kExternal) {
      r["backend"] = "peer";
      r["same_work"] = m.same_work;
    }
    if (measured.errors.count(m.name)) r["error"] = measured.errors.at(m.name);
    results.push_back(std::move(r));
  }
  return results;
}

struct Best {
  double gbps = 0;
  std::string name;  // empty when none ran
};

// The fastest of the baselines, and the fastest of those and the peers that do loadstone's work
// (each tensor in its own host memory); mmap views and the like are reported, not compared.
std::pair<Best, Best> BestBaselines(const std::vector<BenchMethod>& methods,
                                    const Measurements& measured) {
  Best baseline;
  for (const char* name : {"read-per-tensor", "mmap-memcpy"}) {
    if (measured.Gbps(name) > baseline.gbps) baseline = {measured.Gbps(name), name};
  }
  Best same_work = baseline;
  for (const BenchMethod& m : methods) {
    if (m.kind == BenchMethod::Kind::kExternal && m.same_work &&
        measured.Gbps(m.name) > same_work.gbps) {
      same_work = {measured.Gbps(m.name), m.name};
    }
  }
  return {baseline, same_work};
}

// The "ratios" object: loadstone's GB/s over the machine's bounds, the best baselines, each
// peer; the conversion's over the plain load; loadstone's peak RSS over the checkpoint's bytes.
nlohmann::ordered_json Ratios(const BenchArgs& args, const std::vector<BenchMethod>& methods,
                              const Measurements& measured) {
  auto gbps = [&measured](const std::string& name) { return measured.Gbps(name); };
  // A ratio over a method that did not run (a remote checkpoint has no local baselines): null.
  auto over = [](double a, double b) {
    return b > 0 ? nlohmann::ordered_json(a / b) : nlohmann::ordered_json(nullptr);
  };
  const auto [best, best_same_work] = BestBaselines(methods, measured);
  nlohmann::ordered_json ratios;
  ratios["loadstone_vs_raw_ceiling"] = over(gbps("loadstone"), gbps("raw-ceiling"));
  // A load can beat neither the writing of its fresh destinations nor, cold, the device; warm,
  // the bytes come from the page cache and the O_DIRECT device read bounds nothing.
  const bool device_bounds = args.cold;
  ratios["machine_bound"] = device_bounds && gbps("raw-ceiling") < gbps("first-touch")
                                ? "raw-ceiling"
                                : "first-touch";
  ratios["loadstone_vs_machine_bound"] =
      gbps("loadstone") /
      (device_bounds ? std::min(gbps("raw-ceiling"), gbps("first-touch")) : gbps("first-touch"));
  ratios["loadstone_vs_best_baseline"] = over(gbps("loadstone"), best.gbps);
  ratios["best_baseline"] = best.name;
  ratios["loadstone_vs_best_same_work"] = over(gbps("loadstone"), best_same_work.gbps);
  ratios["best_same_work"] = best_same_work.name;
  for (const BenchMethod& m : methods) {
    if (m.kind != BenchMethod::Kind::kExternal) continue;
    ratios["loadstone_vs_peer"][m.name] =
        gbps(m.name) > 0 ? nlohmann::ordered_json(gbps("loadstone") / gbps(m.name))
                         : nlohmann::ordered_json(nullptr);
  }
  const std::string cast = "loadstone-bf16-to-" + args.convert_to;
  if (std::any_of(methods.begin(), methods.end(),
                  [&cast](const BenchMethod& m) { return m.name == cast; })) {
    ratios["conversion_vs_plain"] = gbps(cast) / gbps("loadstone");
    ratios["conversion_vs_first_touch"] = gbps(cast) / gbps("first-touch-" + args.convert_to);
  }
  ratios["loadstone_peak_rss_over_bytes"] =
      Measurements::Find(measured.peak_rss, "loadstone") / measured.bytes;
  return ratios;
}

int RunBench(const BenchArgs& args) {
  auto setup = Prepare(args);
  if (!setup.ok()) return ReportError(setup.status());
  const Checkpoint& ckpt = *setup->input.checkpoint;
  const std::vector<BenchMethod>& methods = setup->methods;
  const uint64_t seed = args.seed ? *args.seed : std::random_device{}();
  nlohmann::ordered_json doc;
  doc["path"] = args.flags.path;
  doc["bytes"] = ckpt.total_bytes();
  doc["mode"] = Remote(ckpt) ? "remote" : args.cold ? "cold" : "warm";
  doc["repeat"] = args.repeat;
  doc["seed"] = seed;
  Measurements measured;
  measured.bytes = static_cast<double>(ckpt.total_bytes());
  auto& order = doc["order"] = nlohmann::ordered_json::array();
  if (Status s = RunRounds(args, ckpt, methods, seed, order, measured); !s.ok()) {
    return ReportError(s);
  }
  doc["results"] = Results(methods, measured);
  doc["ratios"] = Ratios(args, methods, measured);
  // Taken once every key is in: an insertion into an ordered_json may move the others.
  const auto& results = doc["results"];
  const auto& ratios = doc["ratios"];
  if (args.json) {
    std::cout << doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }
  PrintTable(doc, results, ratios, args);
  return 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time loadstone against baselines, same run");
  args->flags.Register(cmd, /*path_required=*/true);
  args->read.Register(cmd);
  cmd->add_flag("--cold", args->cold, "Drop the files from the page cache before every run");
  cmd->add_option("--repeat", args->repeat, "Runs per method (the median is reported)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--convert-to", args->convert_to, "Target of the conversion run (f32, f16)");
  cmd->add_option("--peers", args->peers,
                  "Peer program run in the same loop (e.g. 'VENV/bin/python bench/peers.py'): "
                  "'CMD --list' names its peers, 'CMD --run NAME FILE...' times one");
  cmd->add_option("--seed", args->seed, "Seed of the per-round method order (replays an order)");
  cmd->add_option("--settle", args->settle_seconds, "Seconds to wait before every run")
      ->check(CLI::Range(0.0, 60.0));
  cmd->add_flag("--json", args->json, "Print one JSON document");
  cmd->callback([args, exit_code] { *exit_code = RunBench(*args); });
}

}  // namespace loadstone::cli
