// loadstone load MODEL --tp T [--world-size W --rank R --master ADDR:PORT] [--tp-plan FILE]
#include "tools/loadstone/load_rank.h"

#include <dlfcn.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/dist.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/parse.h"

namespace loadstone::cli {
namespace {

// The distributed face, loaded from beside the libloadstone.so this program runs with.
Result<const DistApi*> LoadDistApi() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&loadstone::ShareOf), &info) == 0 || !info.dli_fname) {
    return Status::NotFound("cannot tell where libloadstone.so is, to find libloadstone_dist.so");
  }
  const std::string path =
      (std::filesystem::path(info.dli_fname).parent_path() / "libloadstone_dist.so").string();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return Status::Unsupported(fmt::format(
        "a tensor-parallel load needs the distributed face ({}), which this loadstone does not "
        "have ({}): build loadstone with LibTorch and Debian's libgloo-dev (scripts/setup.sh)",
        path, dlerror()));
  }
  auto* entry = reinterpret_cast<const DistApi* (*)()>(dlsym(library, "loadstone_dist_api"));
  if (entry == nullptr || entry()->version != kDistApiVersion) {
    return Status::Unsupported(fmt::format(
        "{} is not the distributed face of this loadstone (another version): rebuild both", path));
  }
  return entry();
}

// The group from the flags over torchrun's environment over the defaults.
Result<GroupOptions> GroupFrom(const DistApi& api, const RankFlags& flags) {
  LOADSTONE_ASSIGN_OR_RETURN(GroupOptions g, api.group_options_from_environment(GroupOptions()));
  if (flags.world_size) g.world_size = *flags.world_size;
  if (flags.rank) g.rank = *flags.rank;
  if (!flags.master.empty()) {
    const size_t colon = flags.master.rfind(':');
    int port = 0;
    const char* end = flags.master.data() + flags.master.size();
    if (colon == std::string::npos || colon == 0 ||
        std::from_chars(flags.master.data() + colon + 1, end, port).ptr != end || port < 1 ||
        port > 65535) {
      return Status::InvalidArgument(fmt::format(
          "--master {}: give ADDRESS:PORT, e.g. 127.0.0.1:29500", flags.master));
    }
    g.master_addr = flags.master.substr(0, colon);
    g.master_port = port;
  }
  g.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeout_s * 1000));
  return g;
}

void PrintRankText(const RankLoad& r) {
  const RankShare& s = r.share;
  const uint64_t read = r.read_stats.direct_bytes + r.read_stats.buffered_bytes;
  const std::string stage =
      s.options.pp > 1 ? fmt::format(", stage {} of {}: layers {}..{}", s.stage, s.options.pp,
                                     s.layers.first, s.layers.second - 1)
                       : "";
  std::cout << fmt::format(
      "rank {} of {} (tensor-parallel rank {} of {}{}{}, reading {}): {} tensors; read {} (its "
      "share: {} of {} split + {} replicated), received {} from its group; load {:.3f} s, "
      "exchange {:.3f} s\n",
      s.options.rank, s.options.world_size, s.tp_rank, s.options.tp,
      s.options.expert_parallel ? ", experts split" : "", stage,
      s.read_mode == ReadMode::kOnce ? "once" : "each its own", r.tensors.size(),
      HumanBytes(read), HumanBytes(s.read_bytes), HumanBytes(s.split_bytes),
      HumanBytes(s.replicated_bytes), HumanBytes(r.received_bytes), r.load_seconds,
      r.exchange_seconds);
}

int PrintRank(const RankLoad& r, bool json) {
  if (!json) {
    PrintRankText(r);
    return 0;
  }
  const RankShare& s = r.share;
  const uint64_t read = r.read_stats.direct_bytes + r.read_stats.buffered_bytes;
  nlohmann::ordered_json doc;
  doc["rank"] = s.options.rank;
  doc["world_size"] = s.options.world_size;
  doc["tp"] = s.options.tp;
  doc["tp_rank"] = s.tp_rank;
  doc["pp"] = s.options.pp;
  doc["stage"] = s.stage;
  doc["read_mode"] = ReadModeName(s.read_mode);
  doc["expert_parallel"] = s.options.expert_parallel;
  if (s.options.read_mode == ReadMode::kAuto) {
    doc["measured_read_bytes_per_s"] = r.measured_read_bytes_per_s;
    doc["measured_link_bytes_per_s"] = r.measured_link_bytes_per_s;
    doc["estimated_each_seconds"] = r.read_mode_cost.each_seconds;
    doc["estimated_once_seconds"] = r.read_mode_cost.once_seconds;
    doc["probe_bytes"] = r.probe_bytes;
  }
  doc["layers"] = s.options.pp > 1 ? nlohmann::ordered_json::array({s.layers.first,
                                                                     s.layers.second})
                                   : nlohmann::ordered_json();
  // What came off storage (O_DIRECT reads count whole aligned blocks), and what the reads asked
  // for (read or copied out of the page cache): the share's bytes.
  doc["read_bytes"] = read;
  uint64_t requested = 0;
  for (const RouteCount& c : r.read_stats.routes) requested += c.bytes;
  doc["requested_bytes"] = requested;
  doc["share_read_bytes"] = s.read_bytes;
  doc["split_bytes"] = s.split_bytes;
  doc["replicated_bytes"] = s.replicated_bytes;
  doc["expert_bytes"] = s.expert_bytes;
  doc["received_bytes"] = r.received_bytes;
  doc["load_seconds"] = r.load_seconds;
  doc["exchange_seconds"] = r.exchange_seconds;
  auto& tensors = doc["tensors"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    const Tensor& t = r.tensors[i];
    auto crc = Crc32(t);
    if (!crc.ok()) return ReportError(crc.status());
    tensors.push_back({{"name", t.name()},
                       {"dtype", SafetensorsName(t.dtype())},
                       {"shape", t.shape()},
                       {"style", s.tensors[i].style},
                       {"crc32", *crc}});
  }
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

void RankFlags::Register(CLI::App* cmd) {
  cmd->add_option("--world-size", world_size,
                  "Ranks in all (a tensor-parallel load; else WORLD_SIZE, as torchrun sets it)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--rank", rank, "This rank, 0 .. world size - 1 (else RANK)")
      ->check(CLI::Range(0, (1 << 20) - 1));
  cmd->add_option("--tp", tp,
                  "Tensor-parallel degree: each rank reads only its share (default: the world "
                  "size / --pp)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--pp", pp,
                  "Pipeline stages: each stage reads only its layers, split as vLLM splits them "
                  "(default 1)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--pp-layers", pp_layers,
                  "Layers per stage, e.g. 4,6,6,4 (as VLLM_PP_LAYER_PARTITION; default: even, "
                  "the remainder to the stages before the last)")
      ->delimiter(',')
      ->each([this](const std::string&) { dist_only_given = true; });
  auto given = [this](const std::string&) { dist_only_given = true; };
  cmd->add_option("--read-mode", read_mode,
                  "each: every rank reads its own parts (default); once: each tensor-parallel "
                  "group's first rank reads the stage once and sends the others their parts; "
                  "auto: chosen from the measured read and link bandwidths")
      ->check(CLI::IsMember({"each", "once", "auto"}))
      ->each(given);
  cmd->add_flag_callback(
      "--read-once", [this] { read_mode = "once", dist_only_given = true; },
      "Same as --read-mode once");
  cmd->add_option("--master", master,
                  "Where the ranks meet: ADDRESS:PORT of rank 0's store (else MASTER_ADDR and "
                  "MASTER_PORT, or 127.0.0.1:29500)")
      ->each(given);
  cmd->add_option("--tp-plan", tp_plan,
                  "A JSON file of transformers' tp_plan ({\"model.layers.*.mlp.down_proj\": "
                  "\"rowwise\", ...}); default: from config.json")
      ->each(given);
  cmd->add_flag_callback(
      "--ep", [this] { expert_parallel = true, dist_only_given = true; },
      "Expert parallelism over each tensor-parallel group (transformers' ep_size = tp_size): "
      "each rank reads and holds only its experts of every MoE layer");
  cmd->add_option("--ep-plan", ep_plan,
                  "A JSON file of transformers' ep_plan ({\"model.layers.*.mlp.experts."
                  "gate_up_proj\": \"grouped_gemm\", ...}); default: from config.json (with --ep)")
      ->each(given);
  cmd->add_option("--dist-timeout", timeout_s,
                  "Seconds a rank waits for the others before it fails (default 60)")
      ->check(CLI::Range(0.1, 86400.0))
      ->each(given);
}

int RunRankLoad(const PlanFlags& flags, const ReadFlags& read, const RankFlags& rank, bool json) {
  auto api = LoadDistApi();
  if (!api.ok()) return ReportError(api.status());
  auto in = flags.Resolve("cpu");
  if (!in.ok()) return ReportError(in.status());
  PrintWarnings(in->warnings);
  std::vector<std::string> warnings;
  auto loader_options = read.ToLoaderOptions(in->options.platform, &warnings);
  if (!loader_options.ok()) return ReportError(loader_options.status());
  PrintWarnings(warnings);
  auto group = GroupFrom(**api, rank);
  if (!group.ok()) return ReportError(group.status());
  ParallelOptions par;
  par.world_size = group->world_size;
  par.rank = group->rank;
  par.pp = rank.pp.value_or(1);
  par.pp_layers = rank.pp_layers;
  par.read_mode = rank.read_mode == "once"   ? ReadMode::kOnce
                  : rank.read_mode == "auto" ? ReadMode::kAuto
                                             : ReadMode::kEachRank;
  par.tp = rank.tp.value_or(std::max(1, group->world_size / par.pp));
  if (!rank.tp_plan.empty()) {
    auto text = ReadFlagFile("--tp-plan", rank.tp_plan);
    if (!text.ok()) return ReportError(text.status());
    par.tp_plan_json = *text;
  }
  par.expert_parallel = rank.expert_parallel;
  if (!rank.ep_plan.empty()) {
    auto text = ReadFlagFile("--ep-plan", rank.ep_plan);
    if (!text.ok()) return ReportError(text.status());
    par.ep_plan_json = *text;
  }
  auto groups = (*api)->connect(*group, par.tp);
  if (!groups.ok()) return ReportError(groups.status());
  Loader loader(*loader_options);
  auto loaded = (*api)->load_rank(loader, *in->checkpoint, par, in->options, **groups);
  if (!loaded.ok()) {
    return ReportError(loaded.status().WithContext(fmt::format("rank {}", par.rank)));
  }
  return PrintRank(*loaded, json);
}

}  // namespace loadstone::cli
