// loadstone convert IN OUT [--dtype D] [--max-shard-size 5GB] [--variant V] [--from-variant V]
//                          [--subfolder S] [read flags] [--json]
//
// Any checkpoint loadstone reads (safetensors, PyTorch .bin, GGUF) to one safetensors file (OUT
// ends in .safetensors) or a Hugging Face folder: shards split as Hugging Face splits them, their
// index, the input's config.json. With --dtype, quantized weights (GGUF blocks, bitsandbytes)
// are written dequantized and their quant state dropped: a plain checkpoint. Streamed
// (ConvertFeeder): the tensors are loaded by the ordinary pipeline in bounded batches, written as
// the writer asks for them, and let go; memory stays near the staging pool plus two batches,
// whatever the model's size.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/convert_feeder.h"
#include "tools/loadstone/convert_outputs.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/output.h"
#include "tools/loadstone/parse.h"
#include "tools/loadstone/plan_flags.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultStaging = "64MiB";

struct ConvertArgs {
  std::string in, out;
  OpenOptions open;
  std::string dtype;
  std::string max_shard_size = "5GB";
  std::string variant;
  ReadFlags read;
  bool overwrite = false;
  bool json = false;
};

uint64_t PeakRssBytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

// The file name prefix Hugging Face would use: diffusers' for a diffusers checkpoint.
std::string PrefixFor(const Checkpoint& ckpt) {
  const std::string name = fs::path(ckpt.files().front().path).filename().string();
  return name.starts_with("diffusion_pytorch_model") ? "diffusion_pytorch_model" : "model";
}

// Where OUT is written: refused when it is (or holds, or lies inside) the input, or exists
// without --overwrite; otherwise a temporary beside it, renamed into place when whole.
Result<std::unique_ptr<StagedOutput>> StageOutput(const ConvertArgs& args, const Checkpoint& ckpt,
                                                  bool one_file) {
  // The input as given, every file read, and the folder of an index (the model's folder).
  std::vector<std::string> inputs = {args.in, ckpt.config().path};
  for (const CheckpointFile& f : ckpt.files()) inputs.push_back(f.path);
  if (args.in.ends_with(".json")) inputs.push_back(fs::path(args.in).parent_path().string());
  LOADSTONE_RETURN_IF_ERROR(RefuseInputAsOutput(args.out, inputs, "OUT"));
  StagedOutput::Options where;
  where.kind = one_file ? StagedOutput::Kind::kFile : StagedOutput::Kind::kFolder;
  where.may_replace = [&args, one_file](const std::string& target) {
    if (!args.overwrite) {
      return Status::InvalidArgument(fmt::format(
          "OUT '{}' already exists{}: it is left as it is; give a new path, or --overwrite to "
          "replace it",
          args.out, one_file ? "" : " and is not empty"));
    }
    return one_file ? Status::OK() : OnlyCheckpointFiles(target);
  };
  return StagedOutput::Begin(args.out, std::move(where));
}

// How the batches are read: the read flags, with kDefaultStaging unless --staging is given.
// Prints the flags' warnings.
Result<LoaderOptions> BatchLoaderOptions(const ReadFlags& flags) {
  ReadFlags read = flags;
  if (read.staging.empty()) read.staging = kDefaultStaging;
  std::vector<std::string> warnings;
  auto loader_options = read.ToLoaderOptions(nullptr, &warnings);
  if (!loader_options.ok()) return loader_options.status();
  PrintWarnings(warnings);
  return loader_options;
}

// The live line on stderr while converting (only when `show`): bytes written over bytes to
// write, redrawn at most every 100 ms unless forced. `feeder` must outlive it.
class ConvertProgress {
 public:
  ConvertProgress(bool show, const ConvertFeeder& feeder)
      : show_(show),
        feeder_(feeder),
        start_(std::chrono::steady_clock::now()),
        last_draw_(start_) {}

  // REQUIRES: before the first Draw.
  void set_total(uint64_t total) { total_ = total; }
  // Seconds since it was made.
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  void Draw(bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!show_ || (!force && now - last_draw_ < std::chrono::milliseconds(100))) return;
    last_draw_ = now;
    Progress p;
    p.bytes_to_place = total_;
    p.bytes_placed = feeder_.written();
    p.bytes_total = total_;
    p.bytes_read = feeder_.written();
    p.seconds = seconds();
    p.read_gbps = p.seconds > 0 ? p.bytes_placed / p.seconds / 1e9 : 0;
    p.eta_seconds =
        p.bytes_placed > 0 ? p.seconds * (total_ - p.bytes_placed) / p.bytes_placed : 0;
    DrawProgress(p);
  }

  // The last draw, and the line ended.
  void End() {
    Draw(true);
    if (show_) std::cerr << "\n";
  }

 private:
  const bool show_;
  const ConvertFeeder& feeder_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  uint64_t total_ = 0;
};

// Each written file's __metadata__.
std::map<std::string, std::string> FileMetadata() { return {{"format", "pt"}}; }

// Shards and their index into `folder`, then the input's config.json beside them: the paths
// written. A config that cannot be copied is an IOError.
Result<std::vector<std::string>> WriteFolder(const ConvertArgs& args, const Checkpoint& ckpt,
                                             const std::vector<TensorToWrite>& tensors,
                                             uint64_t max_shard, const std::string& folder) {
  ShardedWriteOptions shard_options;
  shard_options.prefix = PrefixFor(ckpt);
  shard_options.variant = args.variant;
  shard_options.max_shard_size = max_shard;
  shard_options.metadata = FileMetadata();
  auto written = WriteShardedSafetensors(folder, tensors, shard_options);
  if (!written.ok() || ckpt.config().path.empty()) return written;
  // The model's config travels with it: the bytes the catalog read (a remote one too).
  const fs::path config = fs::path(folder) / "config.json";
  std::ofstream out(config, std::ios::binary | std::ios::trunc);
  out.write(ckpt.config().text.data(), static_cast<std::streamsize>(ckpt.config().text.size()));
  out.close();
  if (!out) {
    return Status::IOError(fmt::format("cannot write '{}' (the config of '{}'); check the space "
                                       "and permissions there",
                                       config.string(), ckpt.config().path));
  }
  written->push_back(config.string());
  return written;
}

// Writes the outputs into `out`'s temporary (one file, or a folder) and commits it: the paths
// written, as they are at the target.
Result<std::vector<std::string>> WriteOutputs(const ConvertArgs& args, const Checkpoint& ckpt,
                                              const std::vector<TensorToWrite>& tensors,
                                              uint64_t max_shard, bool one_file,
                                              StagedOutput& out) {
  std::vector<std::string> written;
  if (one_file) {
    LOADSTONE_RETURN_IF_ERROR(WriteSafetensors(out.path(), tensors, FileMetadata()));
    written = {out.path()};
  } else {
    LOADSTONE_ASSIGN_OR_RETURN(written, WriteFolder(args, ckpt, tensors, max_shard, out.path()));
  }
  LOADSTONE_RETURN_IF_ERROR(out.Commit());
  return out.AtTarget(written);
}

// What a finished conversion reports.
struct ConvertReport {
  std::vector<std::string> files;  // as at the target
  size_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  size_t batches = 0;
};

// The --json document on stdout.
void PrintJson(const ConvertArgs& args, const Checkpoint& ckpt, std::optional<DType> dtype,
               const ConvertReport& report) {
  nlohmann::ordered_json doc;
  doc["input"] = {{"path", args.in}, {"format", CheckpointFormatName(ckpt.format())},
                  {"resolution", ckpt.resolution()}};
  doc["files"] = report.files;
  doc["tensors"] = report.tensors;
  doc["bytes"] = report.bytes;
  doc["dtype"] = dtype ? nlohmann::ordered_json(TorchName(*dtype)) : nullptr;
  doc["seconds"] = report.seconds;
  doc["batches"] = report.batches;
  doc["peak_rss_bytes"] = PeakRssBytes();
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

// "converted N tensors (...) from FORMAT in S s into K file(s):" and the files, on stdout.
void PrintSummary(const Checkpoint& ckpt, const ConvertReport& report) {
  std::cout << fmt::format("converted {} tensors ({}) from {} in {:.3f} s into {} file(s):\n",
                           report.tensors, HumanBytes(report.bytes),
                           CheckpointFormatName(ckpt.format()), report.seconds,
                           report.files.size());
  for (const std::string& path : report.files) std::cout << "  " << path << "\n";
}

int RunConvert(const ConvertArgs& args) {
  auto ckpt = Checkpoint::Open(args.in, args.open);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  PrintWarnings(ckpt->warnings());
  PlanOptions options;
  if (!args.dtype.empty()) {
    auto dtype = ParseCastTarget(args.dtype, "--dtype");
    if (!dtype.ok()) return ReportError(dtype.status());
    options.dtype = *dtype;
  }
  auto max_shard = ParseSizeFlag(args.max_shard_size, "--max-shard-size");
  if (!max_shard.ok()) return ReportError(max_shard.status());
  // The whole plan, only to learn each tensor's dtype once converted (and to refuse what the
  // pipeline would refuse before anything is written).
  auto whole = Plan(*ckpt, options);
  if (!whole.ok()) return ReportError(whole.status());
  auto fates = DecideFates(*ckpt, *whole, options);
  if (!fates.ok()) return ReportError(fates.status());
  auto loader_options = BatchLoaderOptions(args.read);
  if (!loader_options.ok()) return ReportError(loader_options.status());

  InterruptToCancel interrupt;
  ConvertFeeder feeder(*ckpt, options.dtype, *loader_options, interrupt);
  ConvertProgress progress(!args.json && ::isatty(STDERR_FILENO), feeder);
  const ConvertOutputs outputs =
      ListOutputs(*ckpt, *fates, feeder, [&progress] { progress.Draw(false); });
  progress.set_total(outputs.total);
  const bool one_file = args.out.ends_with(".safetensors");
  if (one_file && !args.variant.empty()) {
    return ReportError(Status::InvalidArgument(
        "--variant names the files of a folder output; OUT is a .safetensors file"));
  }
  LayOutFeeder(*ckpt, *fates, outputs, one_file, *max_shard, feeder);

  auto out = StageOutput(args, *ckpt, one_file);
  if (!out.ok()) return ReportError(out.status());
  auto written = WriteOutputs(args, *ckpt, outputs.tensors, *max_shard, one_file, **out);
  progress.End();
  if (!written.ok()) {
    if (interrupt.interrupted()) {
      std::cerr << fmt::format("cancelled (Ctrl-C) after {:.3f} s: {} of {} written; the partial "
                               "output was removed\n",
                               progress.seconds(), HumanBytes(feeder.written()),
                               HumanBytes(outputs.total));
      return 130;
    }
    return ReportError(written.status());
  }
  const ConvertReport report{*written, outputs.tensors.size(), outputs.total, progress.seconds(),
                             feeder.batches()};
  if (args.json) {
    PrintJson(args, *ckpt, options.dtype, report);
  } else {
    PrintSummary(*ckpt, report);
  }
  return 0;
}

}  // namespace

void AddConvertCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Rewrite a checkpoint (safetensors, .bin, GGUF) as safetensors, streamed");
  cmd->add_option("in", args->in, "A .safetensors, .bin or .gguf file, an index file or a folder")
      ->required();
  cmd->add_option("out", args->out,
                  "OUT.safetensors (one file) or a folder (Hugging Face shards and index)")
      ->required();
  cmd->add_option("--dtype", args->dtype,
                  "Cast floating-point tensors to f32, f16 or bf16 (others are kept as stored)");
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "Largest shard of a folder output (default 5GB; GB = 10^9, GiB = 2^30)");
  cmd->add_option("--variant", args->variant,
                  "Name the output files for this variant (model.fp16.safetensors, ...)");
  cmd->add_option("--from-variant", args->open.variant, "Read the input's weights of this variant");
  cmd->add_option("--subfolder", args->open.subfolder, "Folder inside the input model, e.g. unet");
  args->read.Register(cmd, kDefaultStaging);
  cmd->add_flag("--overwrite", args->overwrite,
                "Replace an existing OUT: a file, or a folder holding only safetensors files, "
                "their index and config.json (never the input)");
  cmd->add_flag("--json", args->json, "Print one JSON document: the files written, sizes, peak RSS");
  cmd->callback([args, exit_code] { *exit_code = RunConvert(*args); });
}

}  // namespace loadstone::cli
