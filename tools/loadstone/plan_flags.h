// The flags of every command that plans (plan, load, bench): what to open, how to plan it —
// each PlanOptions field has its flag — and, for commands that load, how to read.
#ifndef LOADSTONE_TOOLS_PLAN_FLAGS_H_
#define LOADSTONE_TOOLS_PLAN_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"

namespace loadstone::cli {

// What the flags name, resolved: the checkpoint (when a path was given), the model description
// (--model-json), the options, and the warnings the flags themselves raised.
struct PlanInput {
  std::optional<Checkpoint> checkpoint;
  std::optional<ModelDescription> description;
  PlanOptions options;
  std::vector<std::string> warnings;
  std::string source;  // "PATH (N tensors)" or the description's path
};

struct PlanFlags {
  std::string path;
  std::string model_json;
  OpenOptions open;
  std::string dtype;  // "none" (plan): no target, over a description's own
  bool dtype_given = false;  // --dtype was given (perhaps as '')
  bool dtype_none = false;   // "none" is accepted (plan)
  std::vector<std::string> keep_fp32;
  std::vector<std::string> special_dtypes;
  std::string fp8_block;
  std::string device_map;  // empty: the command's default
  std::string max_memory;
  std::vector<std::string> no_split;
  std::string strategy;
  std::vector<std::string> fixes;
  bool offload_buffers = false;
  std::string offload_folder;
  bool fallback_allocation = false;
  bool no_clean = false;
  bool explain = false;
  bool no_stage_cold = false;   // ReadRouteOptions
  bool no_fresh_pages = false;
  bool mmap = false;
  bool pin_memory = false;  // PlanOptions::pin_cpu_tensors
  bool keep_packed = false;  // PlanOptions::keep_packed
  std::string assume_gpus;  // COUNTxSIZE: plan (and load) on a simulated machine
  std::string order;  // --order: execution, file, or a file of module prefixes

  // `path_required`: load and bench need a checkpoint; plan takes one, a description or both.
  void Register(CLI::App* cmd, bool path_required);
  // Opens what was named and builds the options: the description's fields first, then the
  // flags over them. `default_map` applies when neither gives a device map.
  Result<PlanInput> Resolve(std::string_view default_map) const;
};

// How a command that loads reads (LoaderOptions); `platform` is the one the plan was made for
// (PlanInput::options.platform), so that --assume-gpus loads onto the simulated devices.
struct ReadFlags {
  std::string backend = "auto";
  std::string queue_depth = "32";
  std::string in_flight;  // --in-flight; empty: chosen per load
  std::string staging;  // size string; empty: the command's default

  // `default_staging`: what --help says the pool is without --staging.
  void Register(CLI::App* cmd, std::string_view default_staging = "256MiB");
  // A size in bits (--staging 64mb) is said in *warnings.
  Result<LoaderOptions> ToLoaderOptions(std::shared_ptr<const Platform> platform,
                                        std::vector<std::string>* warnings) const;
};

// Prints each warning as "warning: ..." on stderr.
void PrintWarnings(const std::vector<std::string>& warnings);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_PLAN_FLAGS_H_
