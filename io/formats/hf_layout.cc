#include "io/formats/hf_layout.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loadstone::io {
namespace fs = std::filesystem;
namespace {

using Kind = ResolvedCheckpoint::Kind;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Result<ResolvedCheckpoint> ResolveFile(const std::string& path, const OpenOptions& options) {
  if (!options.subfolder.empty() || !options.variant.empty()) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is a file: --variant and --subfolder apply to model folders only", path));
  }
  if (EndsWith(path, ".json")) return ResolvedCheckpoint{Kind::kSafetensorsIndex, path, ""};
  if (EndsWith(path, ".safetensors")) return ResolvedCheckpoint{Kind::kSafetensorsFile, path, ""};
  for (std::string_view ext : {".bin", ".pt", ".pth", ".gguf", ".ckpt"}) {
    if (EndsWith(path, ext)) {
      return Status::Unsupported(fmt::format(
          "'{}': {} checkpoints are not supported yet; convert to safetensors", path, ext));
    }
  }
  return Status::Unsupported(fmt::format(
      "'{}': unknown checkpoint format (expected .safetensors or a *.index.json)", path));
}

std::vector<std::string> FolderListing(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  if (names.size() > 12) {
    names.resize(12);
    names.push_back("...");
  }
  return names;
}

}  // namespace

Result<ResolvedCheckpoint> ResolveCheckpointPath(const std::string& path,
                                                 const OpenOptions& options) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return Status::NotFound(fmt::format("'{}' does not exist", path));
  }
  if (!fs::is_directory(status)) return ResolveFile(path, options);

  const fs::path dir = options.subfolder.empty() ? fs::path(path) : fs::path(path) / options.subfolder;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound(fmt::format("subfolder '{}' does not exist in '{}'",
                                        options.subfolder, path));
  }
  const std::string v = options.variant;
  std::vector<ResolvedCheckpoint> found;  // at most one per prefix: the preferred candidate
  std::vector<std::string> passed_over;
  for (std::string_view prefix : {"model", "diffusion_pytorch_model"}) {
    std::vector<ResolvedCheckpoint> candidates;
    auto add = [&](Kind kind, const std::string& name) {
      if (fs::is_regular_file(dir / name, ec)) candidates.push_back({kind, (dir / name).string(), name});
    };
    add(Kind::kSafetensorsFile, v.empty() ? fmt::format("{}.safetensors", prefix)
                                          : fmt::format("{}.{}.safetensors", prefix, v));
    add(Kind::kSafetensorsIndex, v.empty() ? fmt::format("{}.safetensors.index.json", prefix)
                                           : fmt::format("{}.safetensors.index.{}.json", prefix, v));
    if (!v.empty()) {
      add(Kind::kSafetensorsIndex, fmt::format("{}.{}.safetensors.index.json", prefix, v));
    }
    if (candidates.empty()) continue;
    for (size_t i = 1; i < candidates.size(); ++i) passed_over.push_back(candidates[i].note);
    found.push_back(candidates.front());
  }
  if (found.size() > 1) {
    return Status::InvalidArgument(fmt::format(
        "'{}' holds two checkpoints, {} and {}; pass the one you want as the path",
        dir.string(), found[0].note, found[1].note));
  }
  if (found.empty()) {
    std::string hint;
    if (fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec)) {
      return Status::Unsupported(fmt::format(
          "'{}' holds only PyTorch .bin weights, which are not supported yet; convert them to "
          "safetensors", dir.string()));
    }
    if (!v.empty()) hint = fmt::format(" for variant '{}'", v);
    return Status::NotFound(fmt::format(
        "no safetensors checkpoint{} in '{}' (looked for model[.{}].safetensors, "
        "model.safetensors.index.json, diffusion_pytorch_model*); it holds: {}",
        hint, dir.string(), v.empty() ? "VARIANT" : v, fmt::join(FolderListing(dir), ", ")));
  }
  ResolvedCheckpoint chosen = found.front();
  std::string note = fmt::format("picked {}", chosen.note);
  if (!passed_over.empty()) {
    note += fmt::format(" (also present, not used: {})", fmt::join(passed_over, ", "));
  }
  chosen.note = note;
  return chosen;
}

}  // namespace loadstone::io
