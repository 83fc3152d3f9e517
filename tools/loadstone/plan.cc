// loadstone plan PATH | --model-json FILE [--device-map MODE|DEVICE] [--max-memory 0=10GiB,cpu=30GiB]
//   [--dtype D] [--no-split X]... [--keep-fp32 X]... [--strategy greedy|min-max] [--explain] [--json]
#include <iostream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"

namespace loadstone::cli {
namespace {

struct PlanArgs {
  std::string path;
  std::string model_json;
  OpenOptions open;
  std::string device_map;
  std::string max_memory;
  std::string dtype;
  std::vector<std::string> no_split;
  std::vector<std::string> keep_fp32;
  std::vector<std::string> special_dtypes;
  std::vector<std::string> fixes;
  std::string strategy = "greedy";
  bool offload_buffers = false;
  bool fallback_allocation = false;
  bool no_clean = false;
  bool explain = false;
  bool json = false;
};

std::string Quote(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

Result<DType> ParseDTypeArg(const std::string& text, std::string_view flag) {
  std::optional<DType> dtype = ParseDType(text);
  if (!dtype) return Status::InvalidArgument(fmt::format("{}: unknown dtype '{}'", flag, text));
  return *dtype;
}

// Command-line values override the description's (or the defaults).
Status ApplyArgs(const PlanArgs& args, DeviceMapOptions* o) {
  if (!args.device_map.empty()) o->device_map = args.device_map;
  if (!args.max_memory.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o->max_memory, ParseMaxMemoryFlag(args.max_memory));
  }
  if (args.dtype == "none") {
    o->dtype.reset();
  } else if (!args.dtype.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o->dtype, ParseDTypeArg(args.dtype, "--dtype"));
  }
  if (!args.no_split.empty()) {
    std::vector<std::string> entries;
    for (const std::string& x : args.no_split) {
      if (x != "none") entries.push_back(x);
    }
    o->no_split = entries;
  }
  for (const std::string& k : args.keep_fp32) o->keep_in_fp32.push_back(k);
  for (const std::string& item : args.special_dtypes) {
    size_t eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument(fmt::format("--special-dtype: '{}' is not NAME=DTYPE", item));
    }
    LOADSTONE_ASSIGN_OR_RETURN(o->special_dtypes[item.substr(0, eq)],
                               ParseDTypeArg(item.substr(eq + 1), "--special-dtype"));
  }
  if (args.strategy == "min-max") {
    o->strategy = PlanStrategy::kMinMax;
  } else if (args.strategy != "greedy") {
    return Status::InvalidArgument(
        fmt::format("--strategy: '{}' is neither greedy nor min-max", args.strategy));
  }
  for (const std::string& fix : args.fixes) {
    if (fix == "tie-prefix" || fix == "all") o->fixes.prefix_tie_test = true;
    if (fix == "split-buffers" || fix == "all") o->fixes.requeue_split_buffers = true;
    if (fix == "disk-buffers" || fix == "all") o->fixes.load_disk_buffers = true;
    if (fix != "tie-prefix" && fix != "split-buffers" && fix != "disk-buffers" && fix != "all") {
      return Status::InvalidArgument(fmt::format(
          "--fix: '{}' is not tie-prefix, split-buffers, disk-buffers or all", fix));
    }
  }
  o->offload_buffers = o->offload_buffers || args.offload_buffers;
  o->fallback_allocation = o->fallback_allocation || args.fallback_allocation;
  o->clean_result = !args.no_clean;
  o->explain = args.explain;
  return Status::OK();
}

std::string StringList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + Quote(items[i]);
  return out + "]";
}

void PrintJson(const DevicePlan& plan, bool explain) {
  std::string bytes = "{";
  std::string budgets = "{";
  for (size_t i = 0; i < plan.usage.size(); ++i) {
    const DeviceUsage& u = plan.usage[i];
    bytes += fmt::format("{}{}: {}", i ? ", " : "", Quote(u.device.ToKey()), u.bytes);
    if (u.budget) {
      budgets += fmt::format("{}{}: {}", budgets.size() > 1 ? ", " : "", Quote(u.device.ToKey()), *u.budget);
    }
  }
  std::cout << "{\"device_map\": " << plan.device_map.ToJson() << ", \"bytes_per_device\": " << bytes
            << "}, \"budgets\": " << budgets << "}, \"no_split\": " << StringList(plan.no_split)
            << ", \"default_no_split\": " << (plan.default_no_split ? "true" : "false")
            << ", \"warnings\": " << StringList(plan.warnings);
  if (explain) std::cout << ", \"explanation\": " << StringList(plan.explanation);
  std::cout << "}\n";
}

void PrintHuman(const DevicePlan& plan, const std::string& source, const DeviceMapOptions& o) {
  std::cout << fmt::format("plan for {}: device_map={}, strategy={}\n", source, o.device_map,
                           o.strategy == PlanStrategy::kMinMax ? "min-max" : "greedy");
  if (plan.default_no_split) {
    std::cout << fmt::format(
        "no-split: {} (default: repeated numbered blocks stay whole; --no-split none turns it off)\n",
        plan.no_split.empty() ? "none found" : fmt::format("{}", fmt::join(plan.no_split, ", ")));
  } else {
    std::cout << fmt::format("no-split: {}\n", plan.no_split.empty() ? "none"
                                                                    : fmt::format("{}", fmt::join(plan.no_split, ", ")));
  }
  if (o.explain) {
    std::cout << "\nexplanation:\n";
    for (const std::string& line : plan.explanation) std::cout << "  " << line << "\n";
  }
  size_t width = 6;
  for (const DeviceMap::Entry& e : plan.device_map.entries()) width = std::max(width, e.prefix.size() + 2);
  width = std::min<size_t>(width, 72);
  std::cout << "\ndevice map:\n";
  for (const DeviceMap::Entry& e : plan.device_map.entries()) {
    std::cout << fmt::format("  {:<{}} {}\n", e.prefix.empty() ? "\"\"" : e.prefix, width,
                             e.device.ToString());
  }
  std::cout << fmt::format("\n{:<8} {:>14} {:>14} {:>7}\n", "device", "planned", "budget", "use");
  for (const DeviceUsage& u : plan.usage) {
    std::string budget = u.budget ? HumanBytes(*u.budget) : "-";
    std::string use = u.budget && *u.budget > 0
                          ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(u.bytes) /
                                                       static_cast<double>(*u.budget))
                          : "-";
    std::cout << fmt::format("{:<8} {:>14} {:>14} {:>7}\n", u.device.ToString(), HumanBytes(u.bytes),
                             budget, use);
  }
}

int RunPlan(const PlanArgs& args) {
  if (args.path.empty() == args.model_json.empty()) {
    return ReportError(Status::InvalidArgument("give a checkpoint PATH or --model-json FILE (one of them)"));
  }
  std::optional<ModuleTree> tree;
  DeviceMapOptions options;
  std::string source;
  if (!args.model_json.empty()) {
    auto description = ReadModelDescription(args.model_json);
    if (!description.ok()) return ReportError(description.status());
    tree = description->tree;
    options = description->options;
    source = args.model_json;
  } else {
    auto ckpt = Checkpoint::Open(args.path, args.open);
    if (!ckpt.ok()) return ReportError(ckpt.status());
    auto built = ModuleTree::FromCheckpoint(*ckpt);
    if (!built.ok()) return ReportError(built.status());
    tree = *built;
    source = fmt::format("{} ({} tensors)", args.path, ckpt->tensors().size());
  }
  Status applied = ApplyArgs(args, &options);
  if (!applied.ok()) return ReportError(applied);
  auto plan = InferDeviceMap(*tree, options);
  if (!plan.ok()) return ReportError(plan.status());
  for (const std::string& w : plan->warnings) std::cerr << "warning: " << w << "\n";
  if (args.json) {
    PrintJson(*plan, args.explain);
  } else {
    PrintHuman(*plan, source, options);
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Plan where each part of a model goes (accelerate's device_map, exactly)");
  cmd->add_option("path", args->path, "A .safetensors file, an index file or a model folder");
  cmd->add_option("--model-json", args->model_json, "A model description JSON instead of a checkpoint");
  cmd->add_option("--device-map", args->device_map,
                  "auto | balanced | balanced_low_0 | sequential, or one device (cpu, cuda:1, 1)");
  cmd->add_option("--max-memory", args->max_memory, "Budgets, e.g. 0=10GiB,1=10GiB,cpu=30GiB");
  cmd->add_option("--dtype", args->dtype, "Target dtype for float tensors (bf16, fp16, ...; none)");
  cmd->add_option("--no-split", args->no_split,
                  "Keep whole: a class name or a name glob (model.layers.*); 'none' for nothing")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--keep-fp32", args->keep_fp32, "Keep tensors with this dotted component in float32")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--special-dtype", args->special_dtypes, "NAME=DTYPE for one tensor")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--strategy", args->strategy, "greedy (accelerate) or min-max");
  cmd->add_option("--fix", args->fixes,
                  "Fix a reference defect: tie-prefix, split-buffers, disk-buffers or all")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--offload-buffers", args->offload_buffers, "Buffers stay with offloaded modules");
  cmd->add_flag("--fallback-allocation", args->fallback_allocation,
                "Put a smaller module on a device that would get nothing");
  cmd->add_flag("--no-clean", args->no_clean, "Do not merge keys that share a device");
  cmd->add_flag("--explain", args->explain, "Print the planner's step-by-step reasons");
  cmd->add_flag("--json", args->json, "Print one JSON document on stdout");
  cmd->add_option("--variant", args->open.variant, "Weight variant, e.g. fp16");
  cmd->add_option("--subfolder", args->open.subfolder, "Folder inside the model, e.g. unet");
  cmd->callback([args, exit_code] { *exit_code = RunPlan(*args); });
}

}  // namespace loadstone::cli
