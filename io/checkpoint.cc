#include "loadstone/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "io/checkpoint_impl.h"
#include "io/formats/bnb_state.h"
#include "io/formats/gptq_awq.h"
#include "io/formats/hf_config.h"
#include "io/formats/hf_layout.h"
#include "io/formats/pack_quantized.h"
#include "io/http_reader.h"
#include "io/location.h"

namespace loadstone {

namespace {

using io::ResolvedCheckpoint;
using io::Wide;

// A 64-bit hash over the catalog (Checkpoint::fingerprint), eight bytes a step: each value's
// bytes, then its length, so that ("ab", "c") differs from ("a", "bc").
class Fingerprint {
 public:
  void Add(std::string_view bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      Mix(word);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
    Mix(tail);
    Mix(bytes.size());
  }
  void Add(uint64_t value) { Mix(value); }
  uint64_t value() const { return h_; }

 private:
  void Mix(uint64_t word) {
    h_ = (h_ ^ word) * 0x9E3779B97F4A7C15ULL;
    h_ ^= h_ >> 31;
  }

  uint64_t h_ = 0xcbf29ce484222325ULL;
};

uint64_t FingerprintOf(const Checkpoint::Impl& impl) {
  Fingerprint f;
  for (const CheckpointFile& file : impl.files) {
    f.Add(file.path);
    f.Add(file.bytes);
  }
  for (const TensorInfo& t : impl.tensors) {
    f.Add(t.name);
    f.Add(static_cast<uint64_t>(t.dtype));
    f.Add(static_cast<uint64_t>(t.shape.size()));
    for (uint64_t d : t.shape) f.Add(d);
    f.Add(static_cast<uint64_t>(t.file));
    f.Add(t.offset);
    f.Add(t.nbytes);
    f.Add(t.storage);
    f.Add(static_cast<uint64_t>(t.strides.size()));
    for (uint64_t s : t.strides) f.Add(s);
    f.Add(static_cast<uint64_t>(t.big_endian));
    f.Add(t.packed ? t.packed->scheme : std::string());
  }
  return f.value();
}

// `folder` as an offload folder (its index.json).
ResolvedCheckpoint OffloadFolderAt(const std::string& folder) {
  ResolvedCheckpoint offload;
  offload.format = CheckpointFormat::kOffloadFolder;
  offload.path = folder;
  offload.note = "offload folder: index.json";
  return offload;
}

// Fills impl->by_name; Corruption when a name appears twice.
Status IndexByName(Checkpoint::Impl* impl) {
  // Only reachable without an index (which refuses a tensor in two shards): one file never
  // repeats a key.
  if (const TensorInfo* repeat = impl->IndexNames()) {
    return Status::Corruption(fmt::format("tensor '{}' appears twice", repeat->name));
  }
  return Status::OK();
}

// The model's settings from `config_dir`: config.json, else AutoGPTQ's quantize_config.json.
// Either one present but unusable is a warning, its settings not used; neither is an error.
void ReadConfigs(const std::string& config_dir, Checkpoint::Impl* impl) {
  const std::string config_path = io::JoinLocation(config_dir, "config.json");
  if (io::MayBeThere(config_path)) {
    auto config = io::ReadModelConfig(config_path);
    if (config.ok()) {
      impl->config = std::move(*config);
    } else if (!io::IsRemoteAddress(config_path) || !io::AbsentObject(config_path, config.status())) {
      impl->warnings.push_back(fmt::format("{}; its settings are not used",
                                           config.status().message()));
    }
  }
  // AutoGPTQ keeps its settings beside the weights when config.json has none.
  const std::string quantize_path = io::JoinLocation(config_dir, "quantize_config.json");
  if (impl->config.quant_method.empty() && io::MayBeThere(quantize_path)) {
    const Status read = io::ReadQuantizeConfig(quantize_path, &impl->config);
    if (io::IsRemoteAddress(quantize_path) && io::AbsentObject(quantize_path, read)) {
      impl->config.quant_method.clear();
    } else if (!read.ok()) {
      impl->warnings.push_back(fmt::format("{}; its settings are not used", read.message()));
      impl->config.quant_method.clear();
    }
  }
}

// Sets `packed` on the quantized weights: bitsandbytes, then pack-quantized, then GPTQ / AWQ,
// each looking companions up through impl->by_name.
Status CatalogQuantized(Checkpoint::Impl* impl) {
  const auto find = [impl](std::string_view name) { return impl->Find(name); };
  LOADSTONE_RETURN_IF_ERROR(io::CatalogBitsandbytes(impl->files, &impl->tensors, find));
  LOADSTONE_RETURN_IF_ERROR(io::CatalogPackQuantized(impl->files, &impl->tensors, find));
  return io::CatalogGptqAwq(impl->files, impl->config, &impl->tensors, find, &impl->warnings);
}

// A resolved path's catalog: its files' headers, the names checked unique, config.json.
// `before` and `after`: said in the resolution around what the resolution says.
Result<Checkpoint> OpenResolved(const ResolvedCheckpoint& resolved, bool as_stored,
                                const std::string& source, std::string_view before = {},
                                std::string_view after = {}) {
  auto impl = std::make_shared<Checkpoint::Impl>();
  impl->source = source;
  impl->format = resolved.format;
  LOADSTONE_RETURN_IF_ERROR(io::AddCheckpointFiles(resolved, impl.get()));
  LOADSTONE_RETURN_IF_ERROR(IndexByName(impl.get()));
  if (!resolved.config_dir.empty()) ReadConfigs(resolved.config_dir, impl.get());
  if (!as_stored) LOADSTONE_RETURN_IF_ERROR(CatalogQuantized(impl.get()));
  impl->resolution = resolved.note.empty()
                         ? fmt::format("{} file(s), {} tensors", impl->files.size(),
                                       impl->tensors.size())
                         : fmt::format("{}: {} file(s), {} tensors", resolved.note,
                                       impl->files.size(), impl->tensors.size());
  impl->fingerprint = FingerprintOf(*impl);
  if (const auto& block = impl->config.weight_block_size) {
    impl->resolution += fmt::format("; config.json: float8 weight_block_size {}x{}", (*block)[0],
                                    (*block)[1]);
  }
  impl->resolution = fmt::format("{}{}{}", before, impl->resolution, after);
  return Checkpoint(std::move(impl));
}

}  // namespace

std::string_view CheckpointFormatName(CheckpointFormat format) {
  switch (format) {
    case CheckpointFormat::kSafetensors: return "safetensors";
    case CheckpointFormat::kPyTorch: return "pytorch";
    case CheckpointFormat::kGguf: return "gguf";
    case CheckpointFormat::kOffloadFolder: return "offload-folder";
  }
  return "unknown";
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t TensorInfo::element_count() const {
  if (!packed) return numel();
  uint64_t n = 1;
  for (uint64_t d : packed->element_shape) n *= d;
  return n;
}

uint64_t PackedIntState::words() const {
  switch (order) {
    case PackOrder::kRows: return rows * ((cols * bits + 31) / 32);
    case PackOrder::kGptq: return cols * bits / 32 * rows;
    case PackOrder::kAwq: return cols * (rows * bits / 32);
  }
  return 0;
}

const std::vector<std::string>& PackedLayout::companions() const {
  static const std::vector<std::string> kNone;
  return bnb4         ? bnb4->companions
         : bnb8       ? bnb8->companions
         : packed_int ? packed_int->companions
                      : kNone;
}

Checkpoint::Checkpoint(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

// hf:// `path` with HF_HUB_OFFLINE: from the Hugging Face cache at `root` only.
Result<Checkpoint> OpenHubOffline(const std::string& path, const io::HubAddress& hub,
                                  const std::string& root, const OpenOptions& options) {
  const std::optional<std::string> commit =
      options.read_hub_cache ? io::CachedCommit(root, hub.repo, hub.revision) : std::nullopt;
  Result<Checkpoint> opened = Status::NotFound(
      options.read_hub_cache ? fmt::format("revision '{}' of {} is not in it", hub.revision, hub.repo)
                             : std::string("this open is not to read it (read_hub_cache)"));
  if (commit) {
    Result<ResolvedCheckpoint> cached = io::ResolveCheckpointPath(
        io::JoinLocation(io::HubSnapshotFolder(root, hub.repo, *commit), hub.path), options);
    opened = cached.ok() ? OpenResolved(*cached, options.as_stored, path,
                                        fmt::format("from the Hugging Face cache '{}' at {} "
                                                    "(HF_HUB_OFFLINE): ",
                                                    root, commit->substr(0, 12)))
                         : Result<Checkpoint>(cached.status());
  }
  if (opened.ok()) return opened;
  return Status::NotFound(fmt::format(
      "HF_HUB_OFFLINE is set, so '{}' is read from the Hugging Face cache '{}' only: {}; unset "
      "HF_HUB_OFFLINE to fetch it, or point HF_HUB_CACHE at the cache that holds it",
      path, root, opened.status().message()));
}

// hf:// `path`: from the Hugging Face cache when it holds every file at the commit the Hub names
// (OpenOptions::hub_cache), else from the Hub.
Result<Checkpoint> OpenHub(const std::string& path, const OpenOptions& options) {
  LOADSTONE_ASSIGN_OR_RETURN(const io::HubAddress hub, io::ParseHubAddress(path));
  const std::string root = options.hub_cache.empty() ? io::HubCacheRoot() : options.hub_cache;
  if (io::HubOffline()) return OpenHubOffline(path, hub, root, options);
  LOADSTONE_ASSIGN_OR_RETURN(ResolvedCheckpoint remote, io::ResolveCheckpointPath(path, options));
  const std::optional<io::HubFile> file = io::HubFileOf(remote.path);
  std::error_code ec;
  const std::string local =
      file ? io::HubSnapshotFolder(root, file->repo, file->revision) + "/" + file->path : std::string();
  // Only once the Hub has named the commit: the same files at it in the cache are its bytes.
  if (!options.read_hub_cache || !file || !io::IsCommitHash(file->revision) ||
      !std::filesystem::is_regular_file(local, ec)) {
    return OpenResolved(remote, options.as_stored, path);
  }
  Result<ResolvedCheckpoint> cached = io::ResolveCheckpointPath(local, OpenOptions());
  if (cached.ok() && !remote.config_dir.empty()) {  // the config.json beside it, as the Hub's
    cached->config_dir = std::filesystem::path(local).parent_path().string();
  }
  Result<Checkpoint> opened =
      cached.ok() ? OpenResolved(*cached, options.as_stored, path,
                                 fmt::format("from the Hugging Face cache '{}' at {}: ", root,
                                             file->revision.substr(0, 12)))
                  : Result<Checkpoint>(cached.status());
  if (opened.ok()) return opened;
  // A shard not cached, say: the Hub has them all.
  return OpenResolved(remote, options.as_stored, path, {},
                      fmt::format("; the Hugging Face cache's copy was not used: {}",
                                  opened.status().message()));
}

Result<Checkpoint> Checkpoint::Open(const std::string& path, const OpenOptions& options) {
  if (io::IsHubAddress(path)) return OpenHub(path, options);
  Result<ResolvedCheckpoint> found = io::ResolveCheckpointPath(path, options);
  std::error_code probe;
  if (!found.ok() && found.status().code() == StatusCode::kNotFound && options.subfolder.empty() &&
      std::filesystem::is_regular_file(std::filesystem::path(path) / "index.json", probe)) {
    found = OffloadFolderAt(path);
  }
  LOADSTONE_ASSIGN_OR_RETURN(ResolvedCheckpoint resolved, std::move(found));
  return OpenResolved(resolved, options.as_stored, path);
}

Result<Checkpoint> Checkpoint::OpenOffloadFolder(const std::string& folder) {
  return OpenResolved(OffloadFolderAt(folder), /*as_stored=*/false, folder);
}

Result<Checkpoint> Checkpoint::WithTensors(std::vector<TensorInfo> tensors) const {
  auto impl = std::make_shared<Impl>();
  impl->format = impl_->format;
  impl->files = impl_->files;
  impl->metadata = impl_->metadata;
  impl->index_path = impl_->index_path;
  impl->source = impl_->source;
  impl->config = impl_->config;
  impl->resolution = fmt::format("{} tensors viewed in {}", tensors.size(), impl_->resolution);
  impl->tensors = std::move(tensors);
  const TensorInfo* repeat = impl->IndexNames();
  for (size_t i = 0; i < impl->tensors.size(); ++i) {
    const TensorInfo& t = impl->tensors[i];
    if (t.file >= impl->files.size() || t.offset > impl->files[t.file].bytes ||
        t.nbytes > impl->files[t.file].bytes - t.offset) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' ({} bytes at {} of file {}) is not inside a file of this checkpoint",
          t.name, t.nbytes, t.offset, t.file));
    }
    // 2^67 bits: more than any nbytes holds.
    const std::optional<Wide> bits = io::ShapeBits(t.dtype, t.shape, static_cast<Wide>(1) << 67);
    if (!t.packed && t.strides.empty() && (!bits || *bits != static_cast<Wide>(t.nbytes) * 8)) {
      return Status::InvalidArgument(fmt::format("tensor '{}': {} bytes for its shape and dtype",
                                                 t.name, t.nbytes));
    }
    if (&t == repeat) {
      return Status::InvalidArgument(fmt::format("tensor '{}' is listed twice", t.name));
    }
    impl->total_bytes += t.nbytes;
  }
  impl->fingerprint = FingerprintOf(*impl);
  return Checkpoint(std::move(impl));
}

CheckpointFormat Checkpoint::format() const { return impl_->format; }
const std::vector<CheckpointFile>& Checkpoint::files() const { return impl_->files; }
const std::vector<TensorInfo>& Checkpoint::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& Checkpoint::metadata() const { return impl_->metadata; }
const std::string& Checkpoint::index_path() const { return impl_->index_path; }
const std::string& Checkpoint::source() const { return impl_->source; }
const std::string& Checkpoint::resolution() const { return impl_->resolution; }
const ModelConfig& Checkpoint::config() const { return impl_->config; }
const std::vector<std::string>& Checkpoint::warnings() const { return impl_->warnings; }
uint64_t Checkpoint::total_bytes() const { return impl_->total_bytes; }
uint64_t Checkpoint::fingerprint() const { return impl_->fingerprint; }

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  return impl_->Find(name);
}

}  // namespace loadstone
