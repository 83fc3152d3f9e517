// loadstone plan PATH | --model-json FILE [plan flags (plan_flags.h)] [--json]: the device map a
// load would use, with bytes per device against the budgets.
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/device_map.h"
#include "loadstone/plan.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/plan_flags.h"

namespace loadstone::cli {
namespace {

struct PlanArgs {
  PlanFlags flags;
  bool json = false;
};

// A JSON string; bytes that are not UTF-8 (a flag's value can hold any) become U+FFFD.
std::string Quote(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string StringList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + Quote(items[i]);
  return out + "]";
}

// The read order, module by module, with each module's tensors and placed bytes.
nlohmann::ordered_json ModulesJson(const LoadPlan& load_plan) {
  nlohmann::ordered_json modules = nlohmann::ordered_json::array();
  for (const PlanModule& m : load_plan.modules) {
    uint64_t bytes = 0;
    for (uint32_t t = m.first; t < m.end; ++t) bytes += load_plan.tensors[t].nbytes;
    modules.push_back({{"prefix", m.prefix}, {"tensors", m.end - m.first}, {"bytes", bytes}});
  }
  return modules;
}

// `load_plan` (a checkpoint's plan): sizes are as the load places each tensor, and its routes
// are shown; null: sized as accelerate sizes.
void PrintJson(const DevicePlan& plan, const std::vector<std::string>& warnings, bool explain,
               const LoadPlan* load_plan, const std::vector<TensorInfo>& checkpoint_tensors) {
  const bool placed = load_plan != nullptr;
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
            << ", \"warnings\": " << StringList(warnings)
            << ", \"sizes\": " << (placed ? "\"placed\"" : "\"accelerate\"");
  if (explain) std::cout << ", \"explanation\": " << StringList(plan.explanation);
  if (placed) {
    // What goes to disk: each tensor, read in place from its safetensors file or written to
    // the offload folder.
    nlohmann::ordered_json disk = nlohmann::ordered_json::array();
    for (const OffloadPlan& o : load_plan->offloaded) {
      disk.push_back({{"name", checkpoint_tensors[o.source].name},
                      {"dtype", SafetensorsName(o.dtype)},
                      {"bytes", o.nbytes},
                      {"in_place", o.in_place}});
    }
    std::cout << ", \"offload_folder\": " << Quote(load_plan->offload_folder)
              << ", \"disk\": " << disk.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    uint64_t pinned = 0;
    for (const TensorPlan& t : load_plan->tensors) pinned += t.pinned ? t.nbytes : 0;
    std::cout << ", \"pinned_bytes\": " << pinned;
    // Each quantized weight: its scheme, and whether it is dequantized (into what) or packed.
    nlohmann::ordered_json quantized = nlohmann::ordered_json::array();
    for (const TensorPlan& t : load_plan->tensors) {
      const TensorInfo& src = checkpoint_tensors[t.source];
      if (!src.packed) continue;
      const bool decoded = Unpacks(t.conversion);
      quantized.push_back({{"name", src.name},
                           {"scheme", src.packed->scheme},
                           {"mode", decoded ? "dequantize" : "packed"},
                           {"dtype", std::string(SafetensorsName(decoded ? t.dtype : src.dtype))},
                           {"bytes", t.nbytes}});
    }
    std::cout << ", \"quantized\": "
              << quantized.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::cout << ", \"order\": " << Quote(TensorOrderName(load_plan->order))
              << ", \"modules\": "
              << ModulesJson(*load_plan).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace);
    std::cout << ", \"reads\": " << load_plan->reads.size()
              << ", \"routes\": " << RoutesJson(load_plan->RouteTotals()).dump();
  }
  std::cout << "}\n";
}

// The plan's first lines: what was planned and how, how sizes are counted, the no-split
// modules, and with --explain the planner's reasons. `placed`: a load plan was made.
void PrintHeader(const DevicePlan& plan, const std::string& source, const PlanOptions& o,
                 bool placed) {
  std::cout << fmt::format("plan for {}: device_map={}, strategy={}\n", source,
                           o.explicit_map ? "explicit" : o.device_map,
                           o.strategy == PlanStrategy::kMinMax ? "min-max" : "greedy");
  std::cout << (placed ? "sizes: bytes as the load places them (after --dtype conversions)\n"
                       : "sizes: accelerate's (min of --dtype and the stored dtype)\n");
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
}

// The device map, one prefix a line, then each device's planned bytes against its budget.
void PrintDeviceMap(const DevicePlan& plan) {
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

// The disk tensors (read in place or written to the folder) and the pinned CPU tensors, each
// only when there are some.
void PrintDiskAndPinned(const LoadPlan& load_plan) {
  if (!load_plan.offloaded.empty()) {
    size_t in_place = 0;
    for (const OffloadPlan& off : load_plan.offloaded) in_place += off.in_place;
    std::cout << fmt::format("\ndisk: {} tensors, {}: {} read in place from their safetensors "
                             "file, {} written to {}\n",
                             load_plan.offloaded.size(), HumanBytes(load_plan.offloaded_bytes),
                             in_place, load_plan.offloaded.size() - in_place,
                             load_plan.offload_folder.empty() ? "(no folder)"
                                                              : load_plan.offload_folder);
  }
  size_t pinned = 0;
  uint64_t pinned_bytes = 0;
  for (const TensorPlan& t : load_plan.tensors) {
    pinned += t.pinned;
    pinned_bytes += t.pinned ? t.nbytes : 0;
  }
  if (pinned > 0) {
    std::cout << fmt::format("\npinned: {} CPU tensors, {}, in pinned host memory of the GPU\n",
                             pinned, HumanBytes(pinned_bytes));
  }
}

// Quantized tensors: per scheme, how many are dequantized (into what) and how many stay packed;
// nothing when there are none.
void PrintQuantized(const LoadPlan& load_plan, const std::vector<TensorInfo>& checkpoint_tensors) {
  std::map<std::string, std::pair<size_t, size_t>> schemes;  // scheme → dequantized, packed
  std::set<std::string> into;
  for (const TensorPlan& t : load_plan.tensors) {
    const Boxed<PackedLayout>& packed = checkpoint_tensors[t.source].packed;
    if (!packed) continue;
    const bool decoded = Unpacks(t.conversion);
    (decoded ? schemes[packed->scheme].first : schemes[packed->scheme].second) += 1;
    if (decoded) into.insert(std::string(SafetensorsName(t.dtype)));
  }
  if (!schemes.empty()) {
    std::cout << (into.empty() ? std::string("\nquantized (packed, as stored):\n")
                               : fmt::format("\nquantized (dequantized into {}):\n", fmt::join(into, ", ")));
    for (const auto& [scheme, n] : schemes) {
      std::cout << fmt::format("  {:<8} {:>6} dequantized {:>6} packed\n", scheme, n.first, n.second);
    }
  }
}

// The read order and its modules: the first and last few, as many as fit 80 columns.
void PrintOrder(const LoadPlan& load_plan) {
  const auto& modules = load_plan.modules;
  const std::string head = fmt::format("order: {}, {} modules: ", TensorOrderName(load_plan.order),
                                       modules.size());
  std::string shown;
  for (size_t ends = std::min<size_t>(3, (modules.size() + 1) / 2);; --ends) {
    const bool all = modules.size() <= 2 * ends;
    shown.clear();
    for (size_t i = 0; i < modules.size(); ++i) {
      if (!all && i == ends) {
        shown += fmt::format(", … {} more", modules.size() - 2 * ends);
        i = modules.size() - ends;
      }
      shown += (shown.empty() ? "" : ", ") + modules[i].prefix;
    }
    if (head.size() + shown.size() <= 80 || ends <= 1) break;
  }
  std::cout << "\n" << head << shown << "\n";
}

// The read order, the number of reads, then the reads and bytes of each route taken.
void PrintReads(const LoadPlan& load_plan) {
  PrintOrder(load_plan);
  std::cout << fmt::format("reads: {}\n", load_plan.reads.size());
  const auto totals = load_plan.RouteTotals();
  for (size_t r = 0; r < totals.size(); ++r) {
    if (totals[r].reads == 0) continue;
    std::cout << fmt::format("  {:<18} {:>8} reads {:>14}\n",
                             ReadRouteName(static_cast<ReadRoute>(r)), totals[r].reads,
                             HumanBytes(totals[r].bytes));
  }
}

// The human report on stdout: the device plan; with a load plan (`load_plan` not null), also
// what goes to disk, what is pinned, quantized tensors and reads.
void PrintHuman(const DevicePlan& plan, const std::string& source, const PlanOptions& o,
                const LoadPlan* load_plan, const std::vector<TensorInfo>& checkpoint_tensors) {
  PrintHeader(plan, source, o, load_plan != nullptr);
  PrintDeviceMap(plan);
  if (load_plan == nullptr) return;
  PrintDiskAndPinned(*load_plan);
  PrintQuantized(*load_plan, checkpoint_tensors);
  // "staged when cold" and "fresh pages" are settled as each read's turn comes (load --json
  // reports the route each took).
  PrintReads(*load_plan);
}

int RunPlan(const PlanArgs& args) {
  auto in = args.flags.Resolve("auto");
  if (!in.ok()) return ReportError(in.status());
  DevicePlan plan;
  std::vector<std::string> warnings = in->warnings;
  std::optional<LoadPlan> load_plan;
  if (in->checkpoint) {
    auto planned = Plan(*in->checkpoint, in->options);
    if (!planned.ok()) return ReportError(planned.status());
    load_plan = *std::move(planned);
    plan = load_plan->devices;
    warnings.insert(warnings.end(), load_plan->warnings.begin(), load_plan->warnings.end());
  } else {
    auto inferred = InferDeviceMap(*in->options.model, in->options);
    if (!inferred.ok()) return ReportError(inferred.status());
    plan = *std::move(inferred);
    warnings.insert(warnings.end(), plan.warnings.begin(), plan.warnings.end());
  }
  PrintWarnings(warnings);
  static const std::vector<TensorInfo> kNone;
  const std::vector<TensorInfo>& tensors = in->checkpoint ? in->checkpoint->tensors() : kNone;
  if (args.json) {
    PrintJson(plan, warnings, in->options.explain, load_plan ? &*load_plan : nullptr, tensors);
  } else {
    PrintHuman(plan, in->source, in->options, load_plan ? &*load_plan : nullptr, tensors);
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Plan where each part of a model goes (accelerate's device_map, exactly)");
  args->flags.Register(cmd, /*path_required=*/false);
  cmd->add_flag("--json", args->json, "Print one JSON document on stdout");
  cmd->callback([args, exit_code] { *exit_code = RunPlan(*args); });
}

}  // namespace loadstone::cli
