// loadstone convert IN OUT [--dtype D] [--max-shard-size 5GB] [--variant V] [--from-variant V]
//                          [--subfolder S] [read flags] [--json]
//
// Any checkpoint loadstone reads (safetensors, PyTorch .bin, GGUF) to one safetensors file (OUT
// ends in .safetensors) or a Hugging Face folder: shards split as Hugging Face splits them, their
// index, the input's config.json. With --dtype, quantized weights (GGUF blocks, bitsandbytes)
// are written dequantized and their quant state dropped: a plain checkpoint. Streamed: the tensors are loaded by
// the ordinary pipeline in batches of at most kBatchBytes (a large tensor in flat pieces, each
// a view of its file: Checkpoint::WithTensors), written as the writer asks for them, and let go;
// memory stays near the staging pool plus two batches, whatever the model's size.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/output.h"
#include "tools/loadstone/parse.h"
#include "tools/loadstone/plan_flags.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {
namespace {

namespace fs = std::filesystem;

// Bytes (as written) loaded at once; tensors larger than kPieceBytes are loaded in pieces.
constexpr uint64_t kBatchBytes = 32ULL << 20;
constexpr uint64_t kPieceBytes = 16ULL << 20;
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

// One load unit: `count` elements of output tensor `tensor` from element `first`, as a view of
// the source file (`view`), or the whole tensor with its own layout; `with` are the tensors its
// conversion reads (a bitsandbytes weight's quant state), loaded beside it under their names.
struct Unit {
  size_t tensor = 0;
  uint64_t first = 0;         // first element
  uint64_t out_bytes = 0;     // bytes it has once converted
  TensorInfo view;
  std::vector<TensorInfo> with;
  // The view keeps its own name in its batch (a float8 weight: Plan pairs it with its scales by
  // name); the others are named by their unit number.
  bool named = false;
};

struct Batch {
  std::vector<size_t> units;  // indices into Feeder::units_
  std::optional<Checkpoint> catalog;
  std::optional<LoadPlan> plan;
  LoadHandle load;
};

// Feeds the writer's fill callbacks: loads the batch holding the bytes asked for (and starts
// the next one, so that reading overlaps writing), copies them out.
class Feeder {
 public:
  Feeder(const Checkpoint& ckpt, std::optional<DType> dtype, const LoaderOptions& loader_options,
         const InterruptToCancel& interrupt)
      : ckpt_(ckpt),
        dtype_(dtype),
        loader_(loader_options),
        interrupt_(interrupt),
        first_unit_(ckpt.tensors().size(), SIZE_MAX) {}

  // Lays out the units of output tensor `tensor` (source `src`, `out_bytes` once converted;
  // `decoded`: a packed tensor dequantized; `scales`: a float8 weight's, when it is dequantized
  // with them) in the order the writer will ask for them.
  void AddTensor(size_t tensor, const TensorInfo& src, uint64_t out_bytes, bool decoded,
                 const TensorInfo* scales = nullptr) {
    if (out_bytes == 0) return;
    first_unit_[tensor] = units_.size();
    if (decoded) return AddDecoded(tensor, src, out_bytes);
    if (scales != nullptr) {  // whole, with its scales, under its own name
      units_.push_back({tensor, 0, out_bytes, src, {*scales}, true});
      return;
    }
    if (src.packed) {  // a quantized tensor copied as stored: its bytes, its state beside it
      TensorInfo bytes = src;
      bytes.packed.reset();
      return AddTensor(tensor, bytes, out_bytes, false);
    }
    const uint64_t numel = src.numel();
    const uint64_t in_elem = DTypeBits(src.dtype) / 8, out_elem = out_bytes / numel;
    if (out_bytes <= kPieceBytes || !src.strides.empty()) {  // strided: whole (the plan bounds it)
      units_.push_back({tensor, 0, out_bytes, src});
    } else {  // flat pieces of a contiguous tensor: casts are elementwise
      const uint64_t per = kPieceBytes / std::max(in_elem, out_elem);
      for (uint64_t first = 0; first < numel; first += per) {
        const uint64_t count = std::min(per, numel - first);
        TensorInfo view = src;
        view.shape = {count};
        view.offset = src.offset + first * in_elem;
        view.nbytes = count * in_elem;
        units_.push_back({tensor, first, count * out_elem, std::move(view)});
      }
    }
  }

  // Groups the units into batches of at most kBatchBytes each (a larger unit alone).
  void Seal() {
    uint64_t bytes = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (batches_.empty() || bytes + units_[u].out_bytes > kBatchBytes) {
        batches_.emplace_back();
        bytes = 0;
      }
      batches_.back().units.push_back(u);
      if (!units_[u].named) units_[u].view.name = std::to_string(u);
      batch_of_.push_back(batches_.size() - 1);
      bytes += units_[u].out_bytes;
    }
  }

  // Bytes [offset, offset + chunk.size()) of output tensor `tensor`.
  Status Fill(size_t tensor, uint64_t offset, std::span<std::byte> chunk) {
    if (interrupt_.interrupted()) return Status::Cancelled("cancelled (Ctrl-C)");
    size_t u = first_unit_.at(tensor);
    uint64_t unit_start = 0;  // byte of the tensor where unit u starts
    while (unit_start + units_[u].out_bytes <= offset) unit_start += units_[u++].out_bytes;
    uint64_t done = 0;
    while (done < chunk.size()) {
      LOADSTONE_ASSIGN_OR_RETURN(const Tensor* t, Loaded(u));
      const uint64_t from = offset + done - unit_start;
      const uint64_t n = std::min<uint64_t>(chunk.size() - done, t->nbytes() - from);
      std::memcpy(chunk.data() + done, t->data() + from, n);
      done += n;
      written_ += n;
      if (done < chunk.size()) unit_start += units_[u++].out_bytes;
    }
    return Status::OK();
  }

  uint64_t written() const { return written_; }
  size_t batches() const { return batches_.size(); }

 private:
  // A packed tensor decoded: GGUF blocks in pieces of whole blocks, each a packed view of its
  // own; a bitsandbytes weight whole, with its quant state (its absmax covers it whole), so its
  // decoded size is what one unit holds.
  void AddDecoded(size_t tensor, const TensorInfo& src, uint64_t out_bytes) {
    const PackedLayout& packed = *src.packed;
    const auto companions = ckpt_.Companions(src);  // Plan() found them all
    if (companions.ok() && !companions->empty()) {
      Unit unit{tensor, 0, out_bytes, src, {}};
      for (const TensorInfo* c : *companions) unit.with.push_back(*c);
      units_.push_back(std::move(unit));
      return;
    }
    const uint64_t elements = src.element_count();
    const uint64_t out_block = out_bytes / elements * packed.block_elems;
    const uint64_t per = std::max<uint64_t>(1, kPieceBytes / out_block);  // blocks a piece
    const uint64_t blocks = src.nbytes / packed.block_bytes;
    for (uint64_t b = 0; b < blocks; b += per) {
      const uint64_t n = std::min(per, blocks - b);
      TensorInfo view = src;
      view.offset = src.offset + b * packed.block_bytes;
      view.nbytes = n * packed.block_bytes;
      view.shape = {view.nbytes};
      view.packed->element_shape = {n * packed.block_elems};
      units_.push_back({tensor, b * packed.block_elems, n * out_block, std::move(view), {}});
    }
  }

  Status Start(size_t b) {
    Batch& batch = batches_[b];
    if (batch.plan) return Status::OK();
    std::vector<TensorInfo> views;
    for (size_t u : batch.units) {
      views.push_back(units_[u].view);
      views.insert(views.end(), units_[u].with.begin(), units_[u].with.end());
    }
    LOADSTONE_ASSIGN_OR_RETURN(Checkpoint catalog, ckpt_.WithTensors(std::move(views)));
    batch.catalog = std::move(catalog);
    PlanOptions options;
    options.dtype = dtype_;
    LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(*batch.catalog, options));
    batch.plan = std::move(plan);
    batch.load = loader_.Load(*batch.catalog, *batch.plan);
    return Status::OK();
  }

  // The loaded tensor of unit `u`: its batch started (and the next one) and waited for; the
  // batches before it let go.
  Result<const Tensor*> Loaded(size_t u) {
    const size_t b = batch_of_[u];
    if (b != current_) {
      for (size_t old = 0; old < b; ++old) batches_[old] = Batch{};  // their memory goes now
      LOADSTONE_RETURN_IF_ERROR(Start(b));
      if (Status s = batches_[b].load.Done().get(); !s.ok()) return s;
      if (b + 1 < batches_.size()) LOADSTONE_RETURN_IF_ERROR(Start(b + 1));
      current_ = b;
    }
    const std::string name = units_[u].named ? units_[u].view.name : std::to_string(u);
    return &batches_[b].load.Tensor(name).get();
  }

  const Checkpoint& ckpt_;
  std::optional<DType> dtype_;
  Loader loader_;
  const InterruptToCancel& interrupt_;
  std::vector<size_t> first_unit_;  // per output tensor: its first unit
  std::vector<Unit> units_;
  std::vector<size_t> batch_of_;    // per unit
  std::deque<Batch> batches_;
  size_t current_ = SIZE_MAX;
  uint64_t written_ = 0;
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
  std::vector<DType> out_dtype(ckpt->tensors().size());
  std::vector<bool> decoded(ckpt->tensors().size()), dropped(ckpt->tensors().size());
  std::vector<const TensorInfo*> scales_of(ckpt->tensors().size());  // a float8 weight's
  for (const TensorPlan& tp : whole->tensors) {
    const TensorInfo& t = ckpt->tensors()[tp.source];
    out_dtype[tp.source] = tp.dtype;
    decoded[tp.source] = Unpacks(tp.conversion);
    // A quantized tensor is written dequantized (its companions, quant state or float8 scales,
    // then belong to nothing), or as stored with them — unless its bytes alone would lose what
    // they are (GGUF).
    const auto companions = ckpt->Companions(t);
    if (!companions.ok()) return ReportError(companions.status());
    if (decoded[tp.source] || tp.conversion == Conversion::kDequantFp8Block) {
      for (const TensorInfo* c : *companions) {
        dropped[static_cast<size_t>(c - ckpt->tensors().data())] = true;
      }
    }
    if (!decoded[tp.source] && t.packed && companions->empty()) {
      return ReportError(Status::Unsupported(fmt::format(
          "tensor '{}' is {}-packed, which {}: safetensors has no dtype for GGUF blocks, so "
          "written as bytes it would lose its type; {}",
          t.name, t.packed->scheme,
          options.dtype ? "loadstone does not dequantize" : "--dtype would dequantize",
          options.dtype ? "convert a checkpoint of types it decodes"
                        : "give --dtype f32, f16 or bf16")));
    }
    // A scaled float8 weight is written dequantized, whole, loaded with the scales its plan
    // pairs it with.
    if (tp.conversion == Conversion::kDequantFp8Block) {
      scales_of[tp.source] = &ckpt->tensors()[whole->tensors[tp.scale].source];
    }
  }

  ReadFlags read = args.read;
  if (read.staging.empty()) read.staging = kDefaultStaging;
  std::vector<std::string> warnings;
  auto loader_options = read.ToLoaderOptions(nullptr, &warnings);
  if (!loader_options.ok()) return ReportError(loader_options.status());
  PrintWarnings(warnings);

  InterruptToCancel interrupt;
  Feeder feeder(*ckpt, options.dtype, *loader_options, interrupt);
  std::vector<TensorToWrite> outputs;
  uint64_t total = 0;  // complete before the first fill
  // The live line: bytes written over bytes to write.
  const bool show = !args.json && ::isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  auto last_draw = start;
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto draw = [&](bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!show || (!force && now - last_draw < std::chrono::milliseconds(100))) return;
    last_draw = now;
    Progress p;
    p.bytes_to_place = total;
    p.bytes_placed = feeder.written();
    p.bytes_total = total;
    p.bytes_read = feeder.written();
    p.seconds = seconds();
    p.read_gbps = p.seconds > 0 ? p.bytes_placed / p.seconds / 1e9 : 0;
    p.eta_seconds = p.bytes_placed > 0 ? p.seconds * (total - p.bytes_placed) / p.bytes_placed : 0;
    DrawProgress(p);
  };
  std::vector<size_t> source_of;  // per output: its tensor
  for (size_t i = 0; i < ckpt->tensors().size(); ++i) {
    const TensorInfo& t = ckpt->tensors()[i];
    if (dropped[i]) continue;
    // A dequantized weight under the name a model gives it ("M.weight" for "M.weight_packed").
    const std::string& name = decoded[i] ? t.decoded_name() : t.name;
    TensorToWrite w{name, out_dtype[i], decoded[i] ? t.packed->element_shape : t.shape, {}, {}};
    source_of.push_back(i);
    w.fill = [&feeder, &draw, i](uint64_t offset, std::span<std::byte> chunk) {
      Status s = feeder.Fill(i, offset, chunk);
      draw(false);
      return s;
    };
    total += w.nbytes();
    outputs.push_back(std::move(w));
  }
  const bool one_file = args.out.ends_with(".safetensors");
  if (one_file && !args.variant.empty()) {
    return ReportError(Status::InvalidArgument(
        "--variant names the files of a folder output; OUT is a .safetensors file"));
  }
  // The order the writer asks for bytes in: shard by shard, each in its layout order.
  std::vector<std::vector<size_t>> shards =
      one_file ? std::vector<std::vector<size_t>>{{}} : SplitIntoShards(outputs, *max_shard);
  if (one_file) {
    for (size_t i = 0; i < outputs.size(); ++i) shards[0].push_back(i);
  }
  for (const auto& shard : shards) {
    std::vector<TensorToWrite> in_shard;
    for (size_t i : shard) in_shard.push_back(outputs[i]);
    for (size_t k : LayoutOrder(in_shard)) {
      const size_t i = source_of[shard[k]];
      feeder.AddTensor(i, ckpt->tensors()[i], outputs[shard[k]].nbytes(), decoded[i],
                       scales_of[i]);
    }
  }
  feeder.Seal();

  auto out = StageOutput(args, *ckpt, one_file);
  if (!out.ok()) return ReportError(out.status());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  Result<std::vector<std::string>> written = std::vector<std::string>{};
  if (one_file) {
    Status s = WriteSafetensors((*out)->path(), outputs, metadata);
    if (s.ok()) {
      written = std::vector<std::string>{(*out)->path()};
    } else {
      written = s;
    }
  } else {
    ShardedWriteOptions shard_options;
    shard_options.prefix = PrefixFor(*ckpt);
    shard_options.variant = args.variant;
    shard_options.max_shard_size = *max_shard;
    shard_options.metadata = metadata;
    written = WriteShardedSafetensors((*out)->path(), outputs, shard_options);
    if (written.ok() && !ckpt->config().path.empty()) {  // the model's config travels with it
      const fs::path config = fs::path((*out)->path()) / "config.json";
      std::error_code ec;
      fs::copy_file(ckpt->config().path, config, ec);
      if (ec) {
        written = Status::IOError(fmt::format("cannot copy '{}' to '{}': {}",
                                              ckpt->config().path, config.string(), ec.message()));
      } else {
        written->push_back(config.string());
      }
    }
  }
  if (written.ok()) {
    if (Status s = (*out)->Commit(); !s.ok()) written = s;
  }
  if (written.ok()) written = (*out)->AtTarget(*written);
  draw(true);
  if (show) std::cerr << "\n";
  if (!written.ok()) {
    if (interrupt.interrupted()) {
      std::cerr << fmt::format("cancelled (Ctrl-C) after {:.3f} s: {} of {} written; the partial "
                               "output was removed\n",
                               seconds(), HumanBytes(feeder.written()), HumanBytes(total));
      return 130;
    }
    return ReportError(written.status());
  }
  const double took = seconds();
  if (args.json) {
    nlohmann::ordered_json doc;
    doc["input"] = {{"path", args.in}, {"format", CheckpointFormatName(ckpt->format())},
                    {"resolution", ckpt->resolution()}};
    doc["files"] = *written;
    doc["tensors"] = outputs.size();
    doc["bytes"] = total;
    doc["dtype"] = options.dtype ? nlohmann::ordered_json(TorchName(*options.dtype)) : nullptr;
    doc["seconds"] = took;
    doc["batches"] = feeder.batches();
    doc["peak_rss_bytes"] = PeakRssBytes();
    std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << fmt::format("converted {} tensors ({}) from {} in {:.3f} s into {} file(s):\n",
                           outputs.size(), HumanBytes(total), CheckpointFormatName(ckpt->format()),
                           took, written->size());
  for (const std::string& path : *written) std::cout << "  " << path << "\n";
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
