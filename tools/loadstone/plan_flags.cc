#include "tools/loadstone/plan_flags.h"

#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "io/formats/json_util.h"
#include "loadstone/platform.h"
#include "tools/loadstone/parse.h"

namespace loadstone::cli {
namespace {

// Options a flag may take several times, each time one value (so that a value never swallows
// the positional path), commas splitting further ("norm,lm_head").
CLI::Option* Repeatable(CLI::App* cmd, const char* name, std::vector<std::string>& into,
                        const std::string& help) {
  return cmd->add_option(name, into, help)
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
}

// --device-map as a map: JSON text ('{"model.embed_tokens": 0, ...}') or a .json file holding
// one, or the document `loadstone plan --json` prints. nullopt for a mode or a device name.
Result<std::optional<DeviceMap>> ExplicitMap(const std::string& value) {
  std::string text;
  if (!value.empty() && value.front() == '{') {
    text = value;
  } else if (value.ends_with(".json")) {
    LOADSTONE_ASSIGN_OR_RETURN(text, ReadFlagFile("--device-map", value));
  } else {
    return std::optional<DeviceMap>();
  }
  auto map = DeviceMap::FromJson(text);
  if (!map.ok()) return map.status().WithContext("--device-map");
  return std::optional<DeviceMap>(*std::move(map));
}

}  // namespace

void PlanFlags::Register(CLI::App* cmd, bool path_required) {
  auto* p = cmd->add_option("path", path,
                            "A .safetensors, .bin or .gguf file, an index file or a model folder");
  if (path_required) p->required();
  cmd->add_option("--model-json", model_json,
                  "A model description JSON (docs/model-json.md): the module tree, classes and "
                  "ties to plan on, and its planning fields");
  cmd->add_option("--variant", open.variant, "Weight variant, e.g. fp16");
  cmd->add_option("--subfolder", open.subfolder, "Folder inside the model, e.g. unet");
  dtype_none = !path_required;  // plan
  cmd->add_option("--dtype", dtype,
                  fmt::format("Cast floating-point tensors to {}{}", kCastTargetSpellings,
                              dtype_none ? "; none: no target, over --model-json's own" : ""))
      ->each([this](const std::string&) { dtype_given = true; });
  Repeatable(cmd, "--keep-fp32", keep_fp32,
             "With --dtype f16|bf16: keep tensors whose dotted name has this component (or run "
             "of components) in float32; repeat or separate with commas");
  Repeatable(cmd, "--special-dtype", special_dtypes,
             "NAME=DTYPE: cast this one tensor (full name) to DTYPE; repeatable");
  cmd->add_option("--fp8-block", fp8_block,
                  "ROWS,COLS of one float8 weight scale (quantization_config.weight_block_size; "
                  "default: the model's config.json, else 128,128); with --dtype, float8 "
                  "weights with a _scale_inv or _scale sibling are dequantized");
  cmd->add_option("--device-map", device_map,
                  "cpu, a device (cuda:1, 1), auto|balanced|balanced_low_0|sequential, or a map: "
                  "JSON text or a .json file (also what `plan --json` prints)");
  cmd->add_option("--max-memory", max_memory,
                  "Budgets for the device map, e.g. 0=10GiB,cpu=30GiB (GiB = 2^30, GB = 10^9)");
  Repeatable(cmd, "--no-split", no_split,
             "Keep whole: a name glob (model.layers.*) or, with --model-json, a class name; "
             "repeatable; 'none' keeps nothing whole (default: repeated numbered blocks)");
  cmd->add_option("--strategy", strategy, "greedy (accelerate, default) or min-max")
      ->check(CLI::IsMember({"greedy", "min-max"}));
  Repeatable(cmd, "--fix", fixes,
             "Fix a reference defect: tie-prefix, split-buffers, disk-buffers or all");
  cmd->add_flag("--offload-buffers", offload_buffers, "Buffers stay with offloaded modules");
  cmd->add_option("--offload-folder", offload_folder,
                  "Where tensors mapped to disk are written (accelerate's index.json + NAME.dat); "
                  "plain safetensors tensors are read in place and need none");
  cmd->add_flag("--fallback-allocation", fallback_allocation,
                "Put a smaller module on a device that would get nothing");
  cmd->add_flag("--no-clean", no_clean, "Do not merge keys that share a device");
  cmd->add_flag("--explain", explain, "Print the planner's step-by-step reasons");
  cmd->add_flag("--no-stage-cold", no_stage_cold,
                "Read cold CPU tensors straight into place instead of through staging");
  cmd->add_flag("--no-fresh-pages", no_fresh_pages,
                "Write CPU tensors into ordinary (kernel-zeroed) pages, not userfaultfd-filled ones");
  cmd->add_flag("--mmap", mmap, "Map tensors that need no conversion instead of reading them");
  cmd->add_flag("--keep-packed", keep_packed,
                "Quantized tensors stay packed as stored even with --dtype (else dequantized)");
  cmd->add_flag("--pin-memory", pin_memory,
                "Put CPU tensors in pinned host memory of the GPU (fails without one)");
  cmd->add_option("--order", order,
                  "Read order: execution (default: the order the model runs), file (as stored), "
                  "or FILE: module prefixes, one a line, read first in that order")
      ->type_name("ORDER");
  cmd->add_option("--assume-gpus", assume_gpus,
                  "Plan for a machine with COUNT GPUs of SIZE each (e.g. 2x80GiB) instead of this "
                  "one; `load` then places their tensors on simulated devices (host memory)");
}

namespace {

// Opens what `flags` name into `in`: the --model-json description (its options the base of
// in.options), then the checkpoint (its warnings into in.warnings); in.source says which.
// InvalidArgument when neither is named.
Status OpenNamed(const PlanFlags& flags, PlanInput& in) {
  if (flags.path.empty() && flags.model_json.empty()) {
    return Status::InvalidArgument("give a checkpoint PATH, a --model-json FILE, or both");
  }
  if (!flags.model_json.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(in.description, ReadModelDescription(flags.model_json));
    static_cast<DeviceMapOptions&>(in.options) = in.description->options;
    in.options.model = in.description->tree;
    in.source = flags.model_json;
  }
  if (!flags.path.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(in.checkpoint, Checkpoint::Open(flags.path, flags.open));
    for (const std::string& w : in.checkpoint->warnings()) in.warnings.push_back(w);
    in.source = fmt::format("{} ({} tensors)", flags.path, in.checkpoint->tensors().size());
  }
  return Status::OK();
}

// --dtype into o.dtype: "none" (where the command takes it) clears it, a cast target sets it,
// absent leaves it; InvalidArgument for "none" elsewhere, '' or an unknown dtype.
Status SetDType(const PlanFlags& flags, PlanOptions& o) {
  if (flags.dtype == "none" && !flags.dtype_none) {
    return Status::InvalidArgument(
        "--dtype none: only `plan` takes none (no target over a --model-json description's "
        "own); leave --dtype out to load every tensor as stored");
  }
  if (flags.dtype == "none") {
    o.dtype.reset();
  } else if (flags.dtype_given && flags.dtype.empty()) {
    return Status::InvalidArgument(fmt::format(
        "--dtype '': give a dtype, {}; or leave --dtype out to load every tensor as stored",
        kCastTargetSpellings));
  } else if (!flags.dtype.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o.dtype, ParseCastTarget(flags.dtype, "--dtype"));
  }
  return Status::OK();
}

// Each --special-dtype NAME=DTYPE into o.special_dtypes; InvalidArgument for the first that is
// not of that form or names no cast target.
Status SetSpecialDTypes(const std::vector<std::string>& special_dtypes, PlanOptions& o) {
  for (const std::string& item : special_dtypes) {
    const size_t eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::InvalidArgument(
          fmt::format("--special-dtype: '{}' is not NAME=DTYPE (a full tensor name)", item));
    }
    LOADSTONE_ASSIGN_OR_RETURN(
        o.special_dtypes[item.substr(0, eq)],
        ParseCastTarget(item.substr(eq + 1), fmt::format("--special-dtype {}", item.substr(0, eq))));
  }
  return Status::OK();
}

// Each --fix turned on in `out`; InvalidArgument for the first that names no fix (those before
// it stay on).
Status SetFixes(const std::vector<std::string>& fixes, ReferenceFixes& out) {
  for (const std::string& fix : SplitLists(fixes)) {
    if (fix == "tie-prefix" || fix == "all") out.prefix_tie_test = true;
    if (fix == "split-buffers" || fix == "all") out.requeue_split_buffers = true;
    if (fix == "disk-buffers" || fix == "all") out.load_disk_buffers = true;
    if (fix != "tie-prefix" && fix != "split-buffers" && fix != "disk-buffers" && fix != "all") {
      return Status::InvalidArgument(fmt::format(
          "--fix: '{}' is not tie-prefix, split-buffers, disk-buffers or all", fix));
    }
  }
  return Status::OK();
}

// The flags that need no parsing, over what the description set: offload, pinning, packing,
// cleaning, explaining and the read routes.
void SetSwitches(const PlanFlags& flags, PlanOptions& o) {
  o.offload_buffers = o.offload_buffers || flags.offload_buffers;
  if (!flags.offload_folder.empty()) o.offload_folder = flags.offload_folder;
  o.pin_cpu_tensors = flags.pin_memory;
  o.keep_packed = flags.keep_packed;
  o.fallback_allocation = o.fallback_allocation || flags.fallback_allocation;
  o.clean_result = !flags.no_clean;
  o.explain = flags.explain;
  o.routes.stage_cold_reads = !flags.no_stage_cold;
  o.routes.fill_fresh_pages = !flags.no_fresh_pages;
  o.routes.mmap = flags.mmap;
}

// --order into o.order: "execution", "file", or a file naming module prefixes (one a line;
// blank lines and '#' comments skipped). InvalidArgument for a file that cannot be read.
Status SetOrder(const std::string& order, PlanOptions& o) {
  if (order.empty() || order == "execution") return Status::OK();
  if (order == "file") {
    o.order = TensorOrder::kFile;
    return Status::OK();
  }
  auto text = io::ReadSmallFile(order, "--order file", 16 << 20, "16 MiB");
  if (!text.ok()) {
    return Status::InvalidArgument(fmt::format(
        "--order: '{}' is not execution, file or a readable file of module prefixes ({})", order,
        text.status().message()));
  }
  o.order = TensorOrder::kGiven;
  for (std::string_view rest = *text; !rest.empty();) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    line = line.substr(0, std::min(line.find('#'), line.size()));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
      line.remove_suffix(1);
    }
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) {
      line.remove_prefix(1);
    }
    if (!line.empty()) o.order_prefixes.emplace_back(line);
  }
  if (o.order_prefixes.empty()) {
    return Status::InvalidArgument(fmt::format(
        "--order: '{}' names no module prefix (one a line, '#' starts a comment)", order));
  }
  return Status::OK();
}

}  // namespace

Result<PlanInput> PlanFlags::Resolve(std::string_view default_map) const {
  PlanInput in;
  LOADSTONE_RETURN_IF_ERROR(OpenNamed(*this, in));
  PlanOptions& o = in.options;
  if (model_json.empty()) o.device_map = std::string(default_map);
  if (!device_map.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o.explicit_map, ExplicitMap(device_map));
    if (!o.explicit_map) o.device_map = device_map;
  }
  if (!max_memory.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o.max_memory, ParseMaxMemoryFlag(max_memory, &in.warnings));
  }
  LOADSTONE_RETURN_IF_ERROR(SetDType(*this, o));
  for (const std::string& k : SplitLists(keep_fp32)) o.keep_in_fp32.push_back(k);
  LOADSTONE_RETURN_IF_ERROR(SetSpecialDTypes(special_dtypes, o));
  if (!fp8_block.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(o.fp8_block, ParseBlockFlag(fp8_block, "--fp8-block"));
  }
  if (!no_split.empty()) {
    std::vector<std::string> entries;
    for (const std::string& x : SplitLists(no_split)) {
      if (x != "none") entries.push_back(x);
    }
    o.no_split = entries;
  }
  if (strategy == "min-max") o.strategy = PlanStrategy::kMinMax;
  if (strategy == "greedy") o.strategy = PlanStrategy::kGreedy;
  LOADSTONE_RETURN_IF_ERROR(SetFixes(fixes, o.fixes));
  SetSwitches(*this, o);
  LOADSTONE_RETURN_IF_ERROR(SetOrder(order, o));
  if (!assume_gpus.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(SimulatedMachine machine, ParseAssumeGpus(assume_gpus, &in.warnings));
    o.platform = Platform::Simulated(machine.WithDevices());  // `load` runs the plan on them
  }
  return in;
}

void ReadFlags::Register(CLI::App* cmd, std::string_view default_staging) {
  cmd->add_option("--backend", backend, "Read backend: auto, uring (io_uring) or pread")
      ->check(CLI::IsMember({"auto", "uring", "io_uring", "pread"}));
  cmd->add_option("--queue-depth", queue_depth, "Reads in flight, 1 to 4096 (default 32)");
  cmd->add_option("--in-flight", in_flight,
                  "At most this many bytes of reads in the kernel's hands at once, e.g. 32MiB "
                  "(default: queue depth x 4 MiB)");
  cmd->add_option("--staging", staging,
                  fmt::format("Staging pool per load, e.g. 64MiB (default {})", default_staging));
}

Result<LoaderOptions> ReadFlags::ToLoaderOptions(std::shared_ptr<const Platform> platform,
                                                 std::vector<std::string>* warnings) const {
  LoaderOptions options;
  const std::string_view depth = queue_depth;
  int n = 0;
  const auto [end, ec] = std::from_chars(depth.data(), depth.data() + depth.size(), n);
  if (ec != std::errc() || end != depth.data() + depth.size() || n < 1 || n > 4096) {
    return Status::InvalidArgument(fmt::format(
        "--queue-depth {}: give the number of reads in flight, a whole number from 1 to 4096",
        queue_depth));
  }
  options.platform = std::move(platform);
  options.backend = backend == "uring" || backend == "io_uring" ? ReadBackend::kUring
                    : backend == "pread"                        ? ReadBackend::kPread
                                                                : ReadBackend::kAuto;
  options.queue_depth = n;
  if (!in_flight.empty()) {
    std::string warning;
    LOADSTONE_ASSIGN_OR_RETURN(options.bytes_in_flight,
                               ParseSizeFlag(in_flight, "--in-flight " + in_flight, &warning));
    if (options.bytes_in_flight == 0) {
      return Status::InvalidArgument(
          "--in-flight 0: give a size such as 64MiB (leave the flag out for the default)");
    }
    if (warnings && !warning.empty()) warnings->push_back(warning);
  }
  if (!staging.empty()) {
    std::string warning;
    LOADSTONE_ASSIGN_OR_RETURN(options.staging_bytes,
                               ParseSizeFlag(staging, "--staging " + staging, &warning));
    if (warnings && !warning.empty()) warnings->push_back(warning);
  }
  return options;
}

void PrintWarnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
}

}  // namespace loadstone::cli
