// loadstone demo: the main job on the built-in default model.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/platform.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/demo_model.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {
namespace {

struct DemoArgs {
  std::string program;  // how to run this binary again
  std::string dir;
  DemoModelShape shape;
};

// `path` as a shell reads it back.
std::string Quoted(const std::string& path) {
  if (path.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "/._-+=:,@") == std::string::npos) {
    return path;
  }
  std::string out = "'";
  for (char c : path) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The flags of the suggested next load: a cast to f32 (twice the bytes) when this machine's
// available memory holds it with room to spare, else the model as stored.
std::string NextLoadFlags(uint64_t placed_bytes) {
  auto available = Platform::Default()->AvailableHostBytes();
  if (available.ok() && 2 * placed_bytes < *available / 10 * 8) return " --dtype f32";
  return "";
}

// How the user ran this binary: "loadstone" when found on PATH, else its absolute path (the
// README's commands run build/loadstone from the checkout).
std::string ProgramName(const std::string& argv0) {
  if (argv0.find('/') == std::string::npos) return "loadstone";
  std::error_code ec;
  const auto self = std::filesystem::canonical("/proc/self/exe", ec);
  return Quoted(ec ? argv0 : self.string());
}

// Opens the model in `folder`, timed, and prints its catalog: tensors, shards, how it resolved.
Result<Checkpoint> OpenAndDescribe(const std::string& folder) {
  const auto open_start = std::chrono::steady_clock::now();
  LOADSTONE_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(folder));
  const double open_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - open_start).count();
  std::cout << fmt::format("demo: catalog of {} tensors in {} shards ({}) read in {:.2f} ms, "
                           "headers only\n",
                           ckpt.tensors().size(), ckpt.files().size(),
                           HumanBytes(ckpt.total_bytes()), open_ms);
  for (size_t i = 0; i < ckpt.files().size(); ++i) {
    std::cout << fmt::format("  shard {}: {} ({})\n", i, ckpt.files()[i].path,
                             HumanBytes(ckpt.files()[i].bytes));
  }
  std::cout << "demo: " << ckpt.resolution() << "\n";
  return ckpt;
}

// The first tensor the loader placed, and when, from `start` (set by the caller).
struct FirstTensor {
  std::chrono::steady_clock::time_point start;
  std::atomic<int64_t> ns{-1};  // -1 until one came
  std::string name;
};

// What the load did, and the commands to try next, on stdout.
void PrintLoaded(const DemoArgs& args, const std::string& folder, const LoadPlan& plan,
                 const LoadHandle& load, const Progress& p, const FirstTensor& first) {
  std::cout << fmt::format(
      "demo: streamed {} tensors ({}) into host memory in {:.3f} s = {:.2f} GB/s\n"
      "demo: first tensor ready after {:.1f} ms ({})\n"
      "demo: read backend: {}\n",
      p.tensors_done, HumanBytes(plan.read_bytes), p.seconds,
      plan.read_bytes / p.seconds / 1e9, first.ns.load() / 1e6, first.name, load.backend());
  std::cout << "demo: read " << ReadSources(load.read_stats())
            << "; cold data comes with O_DIRECT through huge-page staging\n";
  std::cout << "demo: next, try `" << args.program << " load " << Quoted(folder)
            << NextLoadFlags(plan.placed_bytes) << " --trace " << Quoted(folder + ".trace.json")
            << "` or `" << args.program << " bench " << Quoted(folder) << " --cold`\n";
}

int RunDemo(const DemoArgs& args) {
  InterruptToCancel interrupt;  // before the first line: a Ctrl-C from then on cancels
  const std::string folder =
      args.dir.empty() ? DefaultCacheDir() + fmt::format("/demo-llama-{}l", args.shape.layers)
                       : args.dir;
  std::cout << fmt::format("demo: synthetic Llama-shaped bf16 checkpoint, {} layers, {} in {}\n",
                           args.shape.layers, HumanBytes(DemoModelBytes(args.shape)), folder);
  const auto start = std::chrono::steady_clock::now();
  auto made = EnsureDemoModel(folder, args.shape, [&interrupt] { return interrupt.interrupted(); });
  if (!made.ok() && interrupt.interrupted()) {
    std::cerr << "\ndemo: cancelled (Ctrl-C) while writing the model; nothing of it is kept\n";
    return 130;
  }
  if (!made.ok()) return ReportError(made.status());
  std::cout << fmt::format("demo: model ready in {:.1f} s\n",
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  auto ckpt = OpenAndDescribe(folder);
  if (!ckpt.ok()) return ReportError(ckpt.status());

  auto plan = Plan(*ckpt);
  if (!plan.ok()) return ReportError(plan.status());
  std::cout << plan->ToString();
  Loader loader;
  FirstTensor first;
  LoadOptions options;
  first.start = std::chrono::steady_clock::now();
  options.on_tensor = [&first](const Tensor& t) {  // runs on the loader's event loop
    if (first.ns.load() < 0) {
      first.name = t.name();
      first.ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - first.start).count();
    }
  };
  LoadHandle load = loader.Load(*ckpt, *plan, options);
  const WaitResult wait = WaitWithProgress(load, ::isatty(STDERR_FILENO), &interrupt);
  const Progress p = load.progress();
  if (wait.interrupted && wait.status.code() == StatusCode::kCancelled) {
    std::cerr << CancelledLine(p) << "\n";
    return 130;
  }
  if (!wait.status.ok()) return ReportError(wait.status);
  PrintLoaded(args, folder, *plan, load, p, first);
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code, const std::string& argv0) {
  auto args = std::make_shared<DemoArgs>();
  args->program = ProgramName(argv0);
  CLI::App* cmd = app.add_subcommand("demo", "Make (once) and open the built-in default model");
  cmd->add_option("--dir", args->dir, "Where the model lives (default: the cache folder)");
  cmd->add_option("--layers", args->shape.layers, "Decoder layers (16: about 1.7 GB)")
      ->check(CLI::Range(1, 256));
  cmd->callback([args, exit_code] { *exit_code = RunDemo(*args); });
}

}  // namespace loadstone::cli
