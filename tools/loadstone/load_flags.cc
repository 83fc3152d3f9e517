#include "tools/loadstone/load_flags.h"

#include <fmt/format.h>

#include "tools/loadstone/format.h"

namespace loadstone::cli {

void LoadFlags::Register(CLI::App* cmd) {
  cmd->add_option("path", path, "A .safetensors file, an index file or a model folder")->required();
  cmd->add_option("--variant", open.variant, "Weight variant, e.g. fp16");
  cmd->add_option("--subfolder", open.subfolder, "Folder inside the model, e.g. unet");
  cmd->add_option("--dtype", dtype, "Cast floating-point tensors to f32, f16 or bf16");
  cmd->add_option("--keep-fp32", keep_fp32,
                  "Keep tensors whose dotted name contains this component run in float32");
  cmd->add_option("--fp8-block", fp8_block,
                  "Rows,cols of one float8 weight scale (quantization_config.weight_block_size); "
                  "with --dtype, float8 weights with a _scale_inv or _scale sibling are "
                  "dequantized")
      ->delimiter(',')
      ->expected(2);
  cmd->add_option("--device-map", device_map,
                  "cpu (default), a device (cuda:1) or auto|balanced|balanced_low_0|sequential");
  cmd->add_option("--max-memory", max_memory, "Budgets for the device map, e.g. 0=10GiB,cpu=30GiB");
  cmd->add_option("--no-split", no_split, "Modules kept whole (class names or globs; none: off)");
  cmd->add_option("--backend", backend, "Read backend")
      ->check(CLI::IsMember({"auto", "uring", "pread"}));
  cmd->add_option("--queue-depth", queue_depth, "Reads in flight")->check(CLI::Range(1, 4096));
  cmd->add_option("--staging", staging, "Staging pool per load, e.g. 64MiB (default 256MiB)");
  cmd->add_flag("--no-stage-cold", no_stage_cold,
                "Read cold CPU tensors straight into place instead of through staging");
  cmd->add_flag("--no-fresh-pages", no_fresh_pages,
                "Write CPU tensors into ordinary (kernel-zeroed) pages, not userfaultfd-filled ones");
}

Result<PlanOptions> LoadFlags::ToPlanOptions() const {
  PlanOptions options;
  if (!dtype.empty()) {
    auto parsed = ParseDType(dtype);
    if (!parsed) return Status::InvalidArgument(fmt::format("--dtype {}: unknown dtype", dtype));
    options.dtype = *parsed;
  }
  options.keep_in_fp32 = keep_fp32;
  if (!fp8_block.empty()) options.fp8_block = {fp8_block[0], fp8_block[1]};
  options.device_map = device_map;
  if (!max_memory.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(options.max_memory, ParseMaxMemoryFlag(max_memory));
  }
  if (!no_split.empty()) {
    std::vector<std::string> entries;
    for (const std::string& x : no_split) {
      if (x != "none") entries.push_back(x);
    }
    options.no_split = entries;
  }
  return options;
}

Result<LoaderOptions> LoadFlags::ToLoaderOptions() const {
  LoaderOptions options;
  options.backend = backend == "uring"   ? ReadBackend::kUring
                    : backend == "pread" ? ReadBackend::kPread
                                         : ReadBackend::kAuto;
  options.queue_depth = queue_depth;
  options.stage_cold_reads = !no_stage_cold;
  options.fill_fresh_pages = !no_fresh_pages;
  if (!staging.empty()) {
    LOADSTONE_ASSIGN_OR_RETURN(options.staging_bytes, ParseSizeString(staging));
  }
  return options;
}

}  // namespace loadstone::cli
