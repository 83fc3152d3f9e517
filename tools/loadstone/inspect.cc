// loadstone inspect PATH [--json] [--variant V] [--subfolder S]
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"

namespace loadstone::cli {
namespace {

struct InspectArgs {
  std::string path;
  OpenOptions open;
  bool json = false;
};

void PrintJson(const Checkpoint& ckpt) {
  nlohmann::ordered_json doc;
  doc["format"] = CheckpointFormatName(ckpt.format());
  auto& files = doc["files"] = nlohmann::ordered_json::array();
  for (const CheckpointFile& f : ckpt.files()) files.push_back({{"path", f.path}, {"bytes", f.bytes}});
  auto& tensors = doc["tensors"] = nlohmann::ordered_json::array();
  for (const TensorInfo& t : ckpt.tensors()) {
    nlohmann::ordered_json entry = {{"name", t.name},
                                    {"dtype", SafetensorsName(t.dtype)},
                                    {"shape", t.shape},
                                    {"file", t.file},
                                    {"offset", t.offset},
                                    {"nbytes", t.nbytes}};
    // Only where the format has them: a PyTorch tensor's storage and layout, a packed one's blocks.
    if (!t.storage.empty()) entry["storage"] = t.storage;
    if (!t.strides.empty()) entry["strides"] = t.strides;
    if (t.big_endian) entry["big_endian"] = true;
    if (t.packed) {
      entry["packed"] = {{"scheme", t.packed->scheme},
                         {"element_shape", t.packed->element_shape},
                         {"block_elems", t.packed->block_elems},
                         {"block_bytes", t.packed->block_bytes}};
    }
    tensors.push_back(std::move(entry));
  }
  if (!ckpt.metadata().empty()) doc["metadata"] = ckpt.metadata();  // only when there is some
  doc["total_bytes"] = ckpt.total_bytes();
  doc["resolution"] = ckpt.resolution();
  const ModelConfig& config = ckpt.config();
  if (config.path.empty()) {
    doc["config"] = nullptr;
  } else {
    doc["config"] = {{"path", config.path}, {"quant_method", config.quant_method}};
    doc["config"]["weight_block_size"] =
        config.weight_block_size ? nlohmann::ordered_json(*config.weight_block_size) : nullptr;
  }
  doc["warnings"] = ckpt.warnings();
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

void PrintTable(const Checkpoint& ckpt) {
  size_t name_width = 4, dtype_width = 8;  // a packed tensor's scheme can be longer
  for (const TensorInfo& t : ckpt.tensors()) {
    name_width = std::max(name_width, t.name.size());
    if (t.packed) dtype_width = std::max(dtype_width, t.packed->scheme.size());
  }
  name_width = std::min<size_t>(name_width, 72);
  std::cout << fmt::format("{:<{}}  {:<{}} {:<22} {:>12}  {}\n", "name", name_width, "dtype",
                           dtype_width, "shape", "size", "shard");
  std::map<std::string_view, std::pair<size_t, uint64_t>> per_dtype;
  std::vector<std::pair<size_t, uint64_t>> per_file(ckpt.files().size());
  for (const TensorInfo& t : ckpt.tensors()) {
    // A packed tensor by its scheme and element shape (its catalog entry is U8 bytes).
    const std::string_view dtype = t.packed ? std::string_view(t.packed->scheme)
                                            : SafetensorsName(t.dtype);
    std::cout << fmt::format("{:<{}}  {:<{}} {:<22} {:>12}  {}\n", t.name, name_width, dtype,
                             dtype_width, ShapeString(t.packed ? t.packed->element_shape : t.shape),
                             HumanBytes(t.nbytes), t.file);
    auto& d = per_dtype[dtype];
    ++d.first;
    d.second += t.nbytes;
    ++per_file[t.file].first;
    per_file[t.file].second += t.nbytes;
  }
  std::cout << "\nper dtype:\n";
  for (const auto& [dtype, count_bytes] : per_dtype) {
    std::cout << fmt::format("  {:<{}} {:>8} tensors {:>12}\n", dtype, dtype_width + 2,
                             count_bytes.first,
                             HumanBytes(count_bytes.second));
  }
  std::cout << "per shard:\n";
  for (size_t i = 0; i < ckpt.files().size(); ++i) {
    std::cout << fmt::format("  {:>3} {} {:>8} tensors {:>12}\n", i, ckpt.files()[i].path,
                             per_file[i].first, HumanBytes(per_file[i].second));
  }
  for (const auto& [key, value] : ckpt.metadata()) {
    std::cout << fmt::format("metadata: {} = {}\n", key, value);
  }
  std::cout << fmt::format("total: {} tensors, {} ({} bytes) in {} file(s)\n",
                           ckpt.tensors().size(), HumanBytes(ckpt.total_bytes()),
                           ckpt.total_bytes(), ckpt.files().size());
  std::cout << "resolved: " << ckpt.resolution() << "\n";
}

int RunInspect(const InspectArgs& args) {
  auto ckpt = Checkpoint::Open(args.path, args.open);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  for (const std::string& w : ckpt->warnings()) std::cerr << "warning: " << w << "\n";
  if (args.json) {
    PrintJson(*ckpt);
  } else {
    PrintTable(*ckpt);
  }
  return 0;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "List the tensors of a checkpoint (headers only)");
  cmd->add_option("path", args->path, "A .safetensors or .bin file, an index file or a model folder")
      ->required();
  cmd->add_flag("--json", args->json, "Print one JSON document on stdout");
  cmd->add_option("--variant", args->open.variant, "Weight variant, e.g. fp16");
  cmd->add_option("--subfolder", args->open.subfolder, "Folder inside the model, e.g. unet");
  cmd->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace loadstone::cli
