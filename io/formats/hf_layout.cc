#include "io/formats/hf_layout.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/http_reader.h"
#include "io/location.h"

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
  const std::string name = fs::path(path).filename().string();
  if (EndsWith(path, ".json")) {
    // An index names its shards' format: "pytorch_model.bin.index.json", "x.bin.index.fp16.json".
    const bool bin = name.find(".bin.index") != std::string::npos;
    return ResolvedCheckpoint{Kind::kIndex,
                              bin ? CheckpointFormat::kPyTorch : CheckpointFormat::kSafetensors,
                              path, "", ParentLocation(path)};
  }
  if (EndsWith(path, ".safetensors")) {
    return ResolvedCheckpoint{Kind::kFile, CheckpointFormat::kSafetensors, path, "", ""};
  }
  for (std::string_view ext : {".bin", ".pt", ".pth"}) {
    if (EndsWith(path, ext)) {
      return ResolvedCheckpoint{Kind::kFile, CheckpointFormat::kPyTorch, path, "", ""};
    }
  }
  if (EndsWith(path, ".gguf")) {
    return ResolvedCheckpoint{Kind::kFile, CheckpointFormat::kGguf, path, "", ""};
  }
  for (std::string_view ext : {".ckpt"}) {
    if (EndsWith(path, ext)) {
      return Status::Unsupported(fmt::format(
          "'{}': {} checkpoints are not supported yet; convert to safetensors", path, ext));
    }
  }
  return Status::Unsupported(fmt::format(
      "'{}': unknown checkpoint format (expected .safetensors, .bin, .pt, .pth, .gguf or a "
      "*.index.json)", path));
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

bool IsWeightsPrefix(std::string_view name) {
  return name.starts_with("model.") || name.starts_with("pytorch_model.") ||
         name.starts_with("diffusion_pytorch_model.");
}

// The variants whose weights `dir` holds ("fp16" for model.fp16.safetensors or
// model.safetensors.index.fp16.json).
std::vector<std::string> VariantsIn(const fs::path& dir) {
  std::vector<std::string> variants;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!IsWeightsPrefix(name)) continue;
    std::string_view rest = std::string_view(name).substr(name.find('.') + 1);
    std::string variant;
    for (std::string_view ext : {"safetensors", "bin"}) {
      const std::string file = fmt::format(".{}", ext), index = fmt::format("{}.index.", ext),
                        legacy_index = fmt::format(".{}.index.json", ext);
      if (EndsWith(rest, legacy_index)) {  // P.V.safetensors.index.json
        variant = std::string(rest.substr(0, rest.size() - legacy_index.size()));
      } else if (EndsWith(rest, file)) {  // P.V.safetensors
        variant = std::string(rest.substr(0, rest.size() - file.size()));
        if (variant.find('-') != std::string::npos) variant.clear();  // a shard: V-00001-of-...
      } else if (rest.starts_with(index) && EndsWith(rest, ".json") &&
                 rest.size() > index.size() + 5) {  // P.safetensors.index.V.json
        variant = std::string(rest.substr(index.size(), rest.size() - index.size() - 5));
      }
      if (!variant.empty()) break;
    }
    if (!variant.empty() && variant.find('.') == std::string::npos &&
        std::find(variants.begin(), variants.end(), variant) == variants.end()) {
      variants.push_back(variant);
    }
  }
  std::sort(variants.begin(), variants.end());
  return variants;
}

// The subfolders of `dir` that hold safetensors weights (a diffusers pipeline's components).
std::vector<std::string> ComponentsIn(const fs::path& dir) {
  std::vector<std::string> components;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_directory(ec)) continue;
    std::error_code inner;
    for (const auto& file : fs::directory_iterator(entry.path(), inner)) {
      const std::string name = file.path().filename().string();
      if (IsWeightsPrefix(name) && (EndsWith(name, ".safetensors") || EndsWith(name, ".bin") ||
                                    EndsWith(name, ".json"))) {
        components.push_back(entry.path().filename().string());
        break;
      }
    }
  }
  std::sort(components.begin(), components.end());
  return components;
}

// Why `dir` holds no checkpoint, and the fix when one is obvious.
Status NothingFound(const fs::path& dir, const OpenOptions& options) {
  const std::string& v = options.variant;
  std::string hint;
  const std::vector<std::string> variants = VariantsIn(dir);
  const std::vector<std::string> components = ComponentsIn(dir);
  if (!variants.empty()) {
    hint = fmt::format("; it has weights for variant{} {}: pass --variant {}",
                       variants.size() > 1 ? "s" : "", fmt::join(variants, ", "), variants.front());
  } else if (!components.empty()) {
    hint = fmt::format(
        "; it looks like a pipeline folder whose components hold the weights ({}): pass "
        "--subfolder {}",
        fmt::join(components, ", "),
        std::find(components.begin(), components.end(), "unet") != components.end()
            ? std::string("unet")
            : components.front());
  }
  const std::vector<std::string> listing = FolderListing(dir);
  return Status::NotFound(fmt::format(
      "no checkpoint{} in '{}' (looked for model[.{}].safetensors, "
      "model.safetensors.index.json, pytorch_model.bin[.index.json], diffusion_pytorch_model*); "
      "{}{}",
      v.empty() ? "" : fmt::format(" for variant '{}'", v), dir.string(),
      v.empty() ? "VARIANT" : v,
      listing.empty() ? "the folder is empty" : fmt::format("it holds: {}", fmt::join(listing, ", ")),
      hint));
}

// "a FIFO", "a socket", ... for a path that is neither a regular file nor a folder.
std::string_view SpecialKind(fs::file_type type) {
  switch (type) {
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    default: return "not a regular file";
  }
}

// A name a folder may hold its weights under.
struct Candidate {
  Kind kind;
  CheckpointFormat format;
  std::string name;
};

// Per family — Transformers' names (`model` safetensors, `pytorch_model` .bin), then diffusers'
// (`diffusion_pytorch_model`) — the names to look for with variant `v` (none: empty), in
// Hugging Face's order of preference.
std::vector<std::vector<Candidate>> Candidates(const std::string& v) {
  const std::pair<std::string_view, std::string_view> families[] = {
      {"model", "pytorch_model"}, {"diffusion_pytorch_model", "diffusion_pytorch_model"}};
  std::vector<std::vector<Candidate>> out;
  for (const auto& [st_prefix, bin_prefix] : families) {
    std::vector<Candidate>& names = out.emplace_back();
    const std::pair<CheckpointFormat, std::pair<std::string_view, std::string_view>> kinds[] = {
        {CheckpointFormat::kSafetensors, {st_prefix, "safetensors"}},
        {CheckpointFormat::kPyTorch, {bin_prefix, "bin"}}};
    for (const auto& [format, parts] : kinds) {
      const auto& [prefix, ext] = parts;
      names.push_back({Kind::kFile, format,
                       v.empty() ? fmt::format("{}.{}", prefix, ext)
                                 : fmt::format("{}.{}.{}", prefix, v, ext)});
      names.push_back({Kind::kIndex, format,
                       v.empty() ? fmt::format("{}.{}.index.json", prefix, ext)
                                 : fmt::format("{}.{}.index.{}.json", prefix, ext, v)});
      if (!v.empty()) {
        names.push_back({Kind::kIndex, format, fmt::format("{}.{}.{}.index.json", prefix, v, ext)});
      }
    }
  }
  return out;
}

// The checkpoint of folder `dir` (a path or an address) among the candidates `present` says it
// holds: each family's first; none (nullopt) when it holds none, an error when two families do.
Result<std::optional<ResolvedCheckpoint>> Pick(
    const std::string& dir, const std::vector<std::vector<Candidate>>& families,
    const std::function<bool(const std::string&)>& present) {
  std::vector<ResolvedCheckpoint> found;  // at most one per family: the preferred candidate
  std::vector<std::string> passed_over;
  for (const std::vector<Candidate>& family : families) {
    std::vector<const Candidate*> there;
    for (const Candidate& c : family) {
      if (present(c.name)) there.push_back(&c);
    }
    if (there.empty()) continue;
    for (size_t i = 1; i < there.size(); ++i) passed_over.push_back(there[i]->name);
    found.push_back({there[0]->kind, there[0]->format, JoinLocation(dir, there[0]->name),
                     there[0]->name, dir});
  }
  if (found.size() > 1) {
    return Status::InvalidArgument(fmt::format(
        "'{}' holds two checkpoints, {} and {}; pass the one you want as the path", dir,
        found[0].note, found[1].note));
  }
  if (found.empty()) return std::optional<ResolvedCheckpoint>();
  ResolvedCheckpoint chosen = found.front();
  chosen.note = fmt::format("picked {}", chosen.note);
  if (!passed_over.empty()) {
    chosen.note += fmt::format(" (also present, not used: {})", fmt::join(passed_over, ", "));
  }
  return std::optional<ResolvedCheckpoint>(std::move(chosen));
}

// `dir`, a Hub resolve/ address ({endpoint}/ORG/REPO/resolve/REVISION[/PATH]), at `commit`
// instead of its revision, so that the index, the shards and the configs all come from the
// commit the first answer named (X-Repo-Commit), as huggingface_hub's snapshot_download pins a
// revision; `dir` itself when it is not such an address or `commit` is not a commit hash.
std::string PinnedToCommit(const std::string& dir, const std::string& commit) {
  return IsCommitHash(commit) ? WithHubRevision(dir, commit) : dir;
}

// A folder behind an http(s) address, found as transformers finds files on the Hub: by asking
// for each known name (all at once), not by listing.
Result<ResolvedCheckpoint> ResolveRemoteFolder(const std::string& address,
                                               const OpenOptions& options) {
  const std::string dir =
      options.subfolder.empty() ? address : JoinLocation(address, options.subfolder);
  const std::vector<std::vector<Candidate>> families = Candidates(options.variant);
  std::vector<std::string> names, urls;
  for (const auto& family : families) {
    for (const Candidate& c : family) {
      names.push_back(c.name);
      urls.push_back(JoinLocation(dir, c.name));
    }
  }
  const std::vector<Result<HttpObject>> probed = ProbeHttp(urls, HttpReaderOptions());
  std::set<std::string> present;
  std::string commit;  // the Hub's X-Repo-Commit of the first answer that names one
  Status refused;      // an s3:// 403: absent, unless nothing is there (then it is the answer)
  for (size_t i = 0; i < probed.size(); ++i) {
    if (probed[i].ok()) {
      present.insert(names[i]);
      if (commit.empty()) commit = probed[i]->repo_commit;
    } else if (!AbsentObject(urls[i], probed[i].status())) {
      return probed[i].status();
    } else if (refused.ok() && probed[i].status().code() != StatusCode::kNotFound) {
      refused = probed[i].status();
    }
  }
  if (present.empty() && !refused.ok()) return refused;
  LOADSTONE_ASSIGN_OR_RETURN(
      std::optional<ResolvedCheckpoint> chosen,
      Pick(PinnedToCommit(dir, commit), families,
           [&present](const std::string& name) { return present.count(name) > 0; }));
  if (chosen) return *chosen;
  return Status::NotFound(fmt::format(
      "no checkpoint at '{}': it has none of {}; check the address{}", dir, fmt::join(names, ", "),
      options.variant.empty() && options.subfolder.empty()
          ? " (weights named P.VARIANT.safetensors need --variant VARIANT, a pipeline's "
            "component --subfolder NAME)"
          : ", --variant and --subfolder"));
}

// What an http(s) address names: a file or an index by its name, else a folder.
Result<ResolvedCheckpoint> ResolveRemote(const std::string& path, const OpenOptions& options) {
  for (std::string_view ext : {".safetensors", ".bin", ".gguf", ".pt", ".pth", ".json", ".ckpt"}) {
    if (EndsWith(path, ext)) return ResolveFile(path, options);
  }
  return ResolveRemoteFolder(path, options);
}

}  // namespace

Result<ResolvedCheckpoint> ResolveCheckpointPath(const std::string& path,
                                                 const OpenOptions& options) {
  if (IsHubAddress(path)) {
    LOADSTONE_ASSIGN_OR_RETURN(const HubAddress hub, ParseHubAddress(path));
    return ResolveRemote(hub.address, options);
  }
  if (IsRemoteAddress(path)) return ResolveRemote(path, options);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) return Status::NotFound(fmt::format("'{}' does not exist", path));
  if (!fs::is_directory(status) && !fs::is_regular_file(status)) {
    return Status::InvalidArgument(fmt::format(
        "'{}' is {}: a checkpoint is a file or a folder", path, SpecialKind(status.type())));
  }
  if (!fs::is_directory(status)) return ResolveFile(path, options);

  const fs::path dir = options.subfolder.empty() ? fs::path(path) : fs::path(path) / options.subfolder;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound(fmt::format("subfolder '{}' does not exist in '{}'",
                                        options.subfolder, path));
  }
  LOADSTONE_ASSIGN_OR_RETURN(
      std::optional<ResolvedCheckpoint> chosen,
      Pick(dir.string(), Candidates(options.variant),
           [&dir](const std::string& name) {
             std::error_code unused;
             return fs::is_regular_file(dir / name, unused);
           }));
  if (!chosen) return NothingFound(dir, options);
  return *chosen;
}

}  // namespace loadstone::io
