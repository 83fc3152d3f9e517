// Flags shared by `load` and `bench`: what to open, how to plan, which backend.
#ifndef LOADSTONE_TOOLS_LOAD_FLAGS_H_
#define LOADSTONE_TOOLS_LOAD_FLAGS_H_

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"

namespace loadstone::cli {

struct LoadFlags {
  std::string path;
  OpenOptions open;
  std::string dtype;
  std::vector<std::string> keep_fp32;
  std::vector<uint64_t> fp8_block;  // rows, cols; empty: the planner's default
  std::string device_map = "cpu";
  std::string max_memory;
  std::vector<std::string> no_split;
  std::string backend = "auto";
  int queue_depth = 32;
  std::string staging;      // size string; empty: the Loader's default
  bool no_stage_cold = false;
  bool no_fresh_pages = false;

  void Register(CLI::App* cmd);
  Result<PlanOptions> ToPlanOptions() const;
  Result<LoaderOptions> ToLoaderOptions() const;
};

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_LOAD_FLAGS_H_
