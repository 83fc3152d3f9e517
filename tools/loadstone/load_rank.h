// `loadstone load MODEL --tp T [--pp P] [--world-size W --rank R --master ADDR:PORT]`: one rank
// of a tensor- (and pipeline-) parallel load (loadstone/dist.h), reading only its share. The distributed face (and with
// it LibTorch) is loaded only then, from libloadstone_dist.so beside libloadstone.so: every
// other command starts without LibTorch.
#ifndef LOADSTONE_TOOLS_LOAD_RANK_H_
#define LOADSTONE_TOOLS_LOAD_RANK_H_

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/loadstone/plan_flags.h"

namespace loadstone::cli {

struct RankFlags {
  std::optional<int> world_size;  // else WORLD_SIZE, else 1
  std::optional<int> rank;        // else RANK, else 0
  std::optional<int> tp;          // else the world size / pp
  std::optional<int> pp;          // pipeline stages, else 1
  std::vector<int> pp_layers;     // layers per stage, else vLLM's split
  std::string read_mode = "each";  // each, once, auto (--read-once: once)
  std::string master;             // ADDR:PORT; else MASTER_ADDR / MASTER_PORT, 127.0.0.1:29500
  std::string tp_plan;            // FILE.json; else config.json's
  bool expert_parallel = false;   // --ep
  std::string ep_plan;            // FILE.json; else config.json's or the model type's
  double timeout_s = 60;

  void Register(CLI::App* cmd);
  bool dist_only_given = false;   // --master, --tp-plan, --ep, ... was given

  // A rank's load was asked for (--tp, --pp, --world-size or --rank given).
  bool asked() const { return world_size || rank || tp || pp; }
};

// Runs this rank's load and prints its report (--json: one document). The exit code.
int RunRankLoad(const PlanFlags& flags, const ReadFlags& read, const RankFlags& rank, bool json);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_LOAD_RANK_H_
