#include "loadstone/checkpoint.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <filesystem>
#include <map>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/file.h"
#include "io/formats/gguf.h"
#include "io/formats/bnb_state.h"
#include "io/formats/gptq_awq.h"
#include "io/formats/hf_config.h"
#include "io/formats/pack_quantized.h"
#include "io/formats/hf_index.h"
#include "io/formats/hf_layout.h"
#include "io/formats/offload_folder.h"
#include "io/formats/safetensors.h"
#include "io/formats/sniff.h"
#include "io/formats/torch_zip.h"

namespace loadstone {

struct Checkpoint::Impl {
  CheckpointFormat format = CheckpointFormat::kSafetensors;
  std::vector<CheckpointFile> files;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string_view, size_t> by_name;  // views into tensors[i].name
  std::map<std::string, std::string> metadata;
  std::string index_path;
  std::string resolution;
  ModelConfig config;
  std::vector<std::string> warnings;
  uint64_t total_bytes = 0;
  uint64_t fingerprint = 0;
};

namespace {

using io::ResolvedCheckpoint;

// FNV-1a over the catalog (Checkpoint::fingerprint).
class Fingerprint {
 public:
  void Add(std::string_view bytes) {
    for (unsigned char c : bytes) h_ = (h_ ^ c) * 0x100000001b3ULL;
    h_ = (h_ ^ 0xff) * 0x100000001b3ULL;  // a separator: ("ab", "c") differs from ("a", "bc")
  }
  void Add(uint64_t value) { Add(std::string_view(reinterpret_cast<const char*>(&value), sizeof(value))); }
  uint64_t value() const { return h_; }

 private:
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

// Appends one file's header to `impl`; the file's index is impl->files.size().
// A header the safetensors rules refuse, with what the file is when its first bytes say so
// (a GGUF file or a zip archive named .safetensors gets more than "HeaderTooLarge").
Status NameForeignFormat(const io::File& file, Status refused) {
  std::array<std::byte, 8> head{};
  if (file.size() < head.size() || !file.ReadExact(0, head).ok()) return refused;
  const std::string what = io::ForeignFormat(head);
  if (what.empty()) return refused;
  return Status(refused.code(), fmt::format("{}; {}", refused.message(), what));
}

void AddTensors(const io::File& file, std::vector<TensorInfo> tensors,
                Checkpoint::Impl* impl) {
  const auto file_index = static_cast<uint32_t>(impl->files.size());
  impl->files.push_back({file.path(), file.size(), file.stamp()});
  for (TensorInfo& t : tensors) {
    t.file = file_index;
    impl->total_bytes += t.nbytes;
    impl->tensors.push_back(std::move(t));
  }
}

Status AddSafetensorsFile(const std::string& path, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(path));
  auto parsed = io::ReadSafetensorsHeader(file);
  if (!parsed.ok()) return NameForeignFormat(file, parsed.status());
  io::SafetensorsHeader header = std::move(*parsed);
  for (auto& [key, value] : header.metadata) impl->metadata.emplace(key, value);
  AddTensors(file, std::move(header.tensors), impl);
  return Status::OK();
}

Status AddTorchFile(const std::string& path, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(path));
  LOADSTONE_ASSIGN_OR_RETURN(io::TorchArchive archive, io::ReadTorchArchive(file));
  for (const std::string& note : archive.notes) {
    impl->warnings.push_back(fmt::format("'{}': {}", path, note));
  }
  AddTensors(file, std::move(archive.tensors), impl);
  return Status::OK();
}

// One GGUF file; `split`: its place in a split set ({number, count}), checked against its
// split.no / split.count keys.
Status AddGgufFile(const std::string& path, std::optional<std::pair<uint32_t, uint32_t>> split,
                   Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(path));
  LOADSTONE_ASSIGN_OR_RETURN(io::GgufFile gguf, io::ReadGgufHeader(file));
  std::string split_no, split_count;
  for (const auto& [key, value] : gguf.metadata) {
    if (key == "split.no") split_no = value;
    if (key == "split.count") split_count = value;
  }
  if (!split && !split_count.empty() && split_count != "0" && split_count != "1") {
    return Status::InvalidArgument(fmt::format(
        "'{}' is part {} of a {}-file GGUF split set, but its name is not NAME-0000K-of-0000N.gguf "
        "as llama.cpp names them; give the split files their llama.cpp names",
        path, split_no, split_count));
  }
  if (split && (split_no != std::to_string(split->first) ||
                split_count != std::to_string(split->second))) {
    return Status::Corruption(fmt::format(
        "'{}' is named as split {} of {} but says split.no = {}, split.count = {}", path,
        split->first, split->second, split_no.empty() ? "(none)" : split_no,
        split_count.empty() ? "(none)" : split_count));
  }
  for (auto& [key, value] : gguf.metadata) impl->metadata.emplace(key, value);
  AddTensors(file, std::move(gguf.tensors), impl);
  return Status::OK();
}

// A GGUF file, or every file of the split set whose member `path` is
// (PREFIX-00002-of-00003.gguf), in order.
Status AddGgufSet(const std::string& path, Checkpoint::Impl* impl) {
  const std::string name = std::filesystem::path(path).filename().string();
  // "-NNNNN-of-MMMMM.gguf": 20 characters.
  constexpr size_t kTail = 20;
  unsigned number = 0, count = 0;
  if (name.size() <= kTail ||
      std::sscanf(name.c_str() + name.size() - kTail, "-%5u-of-%5u.gguf", &number, &count) != 2 ||
      name.compare(name.size() - kTail + 6, 4, "-of-") != 0 || count == 0 || number == 0 ||
      number > count) {
    return AddGgufFile(path, std::nullopt, impl);
  }
  const std::string stem = path.substr(0, path.size() - kTail);
  for (unsigned i = 1; i <= count; ++i) {
    const std::string part = fmt::format("{}-{:05d}-of-{:05d}.gguf", stem, i, count);
    std::error_code ec;
    if (!std::filesystem::exists(part, ec)) {
      return Status::NotFound(fmt::format("split {} of {} of '{}' is missing: '{}'", i, count,
                                          path, part));
    }
    // llama.cpp numbers splits from 0 in split.no.
    LOADSTONE_RETURN_IF_ERROR(AddGgufFile(part, std::pair{i - 1, count}, impl));
  }
  const auto total = impl->metadata.find("split.tensors.count");
  if (total != impl->metadata.end() && total->second != std::to_string(impl->tensors.size())) {
    return Status::Corruption(fmt::format(
        "the split set of '{}' says split.tensors.count = {}, but its {} files hold {} tensors",
        path, total->second, count, impl->tensors.size()));
  }
  return Status::OK();
}

Status AddFile(CheckpointFormat format, const std::string& path, Checkpoint::Impl* impl) {
  switch (format) {
    case CheckpointFormat::kSafetensors: return AddSafetensorsFile(path, impl);
    case CheckpointFormat::kPyTorch: return AddTorchFile(path, impl);
    case CheckpointFormat::kGguf: return AddGgufSet(path, impl);
    case CheckpointFormat::kOffloadFolder: break;  // AddOffloadFolder, not file by file
  }
  return Status::Unsupported(fmt::format("'{}': unknown checkpoint format", path));
}

// Every mapped tensor is in its shard, every shard tensor is mapped to that shard, no tensor
// is in two shards.
Status CheckIndexAgainstShards(const io::ShardIndex& index, const Checkpoint::Impl& impl) {
  // Files were added in the order of index.shards: file i is shard i.
  std::unordered_map<std::string_view, uint32_t> mapped;  // tensor → shard
  mapped.reserve(index.weight_map.size());
  for (const auto& [tensor, shard] : index.weight_map) mapped.emplace(tensor, shard);
  std::unordered_map<std::string_view, uint32_t> where;  // tensor → file index
  where.reserve(impl.tensors.size());
  for (const TensorInfo& t : impl.tensors) {
    auto [it, inserted] = where.emplace(t.name, t.file);
    if (!inserted) {
      return Status::Corruption(fmt::format(
          "tensor '{}' is in two shards, '{}' and '{}' (index '{}')", t.name,
          impl.files[it->second].path, impl.files[t.file].path, index.path));
    }
    auto m = mapped.find(t.name);
    if (m == mapped.end()) {
      return Status::Corruption(fmt::format(
          "shard '{}' holds tensor '{}' (offset {}), which index '{}' does not list",
          impl.files[t.file].path, t.name, t.offset, index.path));
    }
    if (m->second != t.file) {
      return Status::Corruption(fmt::format(
          "index '{}' maps tensor '{}' to '{}', but it is in shard '{}'", index.path, t.name,
          index.shards[m->second], impl.files[t.file].path));
    }
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    if (!where.count(tensor)) {
      return Status::Corruption(fmt::format(
          "index '{}' maps tensor '{}' to shard '{}', which does not hold it", index.path,
          tensor, index.shards[shard]));
    }
  }
  return Status::OK();
}

Status OpenIndex(const std::string& index_path, CheckpointFormat format, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(io::ShardIndex index, io::ReadShardIndex(index_path));
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  for (const std::string& shard : index.shards) {
    const std::string shard_path = (dir / shard).string();
    std::error_code ec;
    if (!std::filesystem::exists(shard_path, ec)) {
      return Status::NotFound(fmt::format("shard '{}' named by index '{}' does not exist",
                                          shard_path, index_path));
    }
    LOADSTONE_RETURN_IF_ERROR(AddFile(format, shard_path, impl));
  }
  LOADSTONE_RETURN_IF_ERROR(CheckIndexAgainstShards(index, *impl));
  impl->index_path = index_path;
  return Status::OK();
}

__extension__ using Wide = unsigned __int128;

// The bits of a tensor of `dtype` and `shape` (0 when a dimension is 0), multiplied in 128 bits
// and stopped once past `limit` — before a product can wrap: nullopt then. A hostile shape's
// size is never taken modulo 2^128.
std::optional<Wide> ShapeBits(DType dtype, const std::vector<uint64_t>& shape, Wide limit) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return Wide{0};
  Wide bits = DTypeBits(dtype);
  for (uint64_t d : shape) {
    bits *= d;  // bits <= limit < 2^68 before, d < 2^64: no wrap
    if (bits > limit) return std::nullopt;
  }
  return bits;
}

// An offload folder's entries: each NAME.dat a file of its own (at least as long as its
// tensor), each safetensors reference the tensor of that file's header, renamed to its entry.
Status AddOffloadFolder(const std::string& folder, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<io::OffloadIndexEntry> entries,
                             io::ReadOffloadIndex(folder));
  std::unordered_map<std::string, std::pair<uint32_t, std::vector<TensorInfo>>> headers;
  // In-place entries whose index names another dtype: (stored, index's) → count, the first.
  std::map<std::pair<DType, DType>, std::pair<size_t, std::string>> recast;
  for (const io::OffloadIndexEntry& e : entries) {
    if (!e.safetensors_file.empty()) {
      auto it = headers.find(e.safetensors_file);
      if (it == headers.end()) {
        LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(e.safetensors_file));
        auto parsed = io::ReadSafetensorsHeader(file);
        if (!parsed.ok()) return NameForeignFormat(file, parsed.status());
        const auto index = static_cast<uint32_t>(impl->files.size());
        impl->files.push_back({e.safetensors_file, file.size(), file.stamp()});
        it = headers.emplace(e.safetensors_file, std::pair{index, std::move(parsed->tensors)}).first;
      }
      const auto& [file_index, tensors] = it->second;
      auto t = std::find_if(tensors.begin(), tensors.end(),
                            [&](const TensorInfo& x) { return x.name == e.weight_name; });
      if (t == tensors.end()) {
        return Status::Corruption(fmt::format(
            "offload folder '{}': entry '{}' names tensor '{}' of '{}', which that file does not "
            "hold",
            folder, e.name, e.weight_name, e.safetensors_file));
      }
      TensorInfo info = *t;
      info.name = e.name;
      info.file = file_index;
      if (e.dtype && *e.dtype != info.dtype) {
        auto& [count, first] = recast[{info.dtype, *e.dtype}];
        if (count++ == 0) first = e.name;
      }
      impl->total_bytes += info.nbytes;
      impl->tensors.push_back(std::move(info));
      continue;
    }
    const std::string path = io::OffloadDataPath(folder, e.name);
    const std::optional<Wide> bits = ShapeBits(*e.dtype, e.shape, static_cast<Wide>(1) << 62);
    if (!bits || *bits % 8 != 0) {
      return Status::Corruption(fmt::format(
          "offload folder '{}': entry '{}' has shape and dtype {} whose size is not a whole "
          "number of bytes below 2^59",
          folder, e.name, TorchName(*e.dtype)));
    }
    const auto nbytes = static_cast<uint64_t>(*bits / 8);
    LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(path));
    // A scalar is stored as one element, like a 1-element vector (accelerate's memmap).
    if (file.size() < nbytes) {
      return Status::Corruption(fmt::format(
          "offload file '{}' holds {} bytes but index entry '{}' ({} {}) needs {}; the folder "
          "is incomplete: offload again",
          path, file.size(), e.name, TorchName(*e.dtype), fmt::join(e.shape, "x"), nbytes));
    }
    TensorInfo info;
    info.name = e.name;
    info.dtype = *e.dtype;
    info.shape = e.shape;
    info.offset = 0;
    info.nbytes = nbytes;
    AddTensors(file, {std::move(info)}, impl);
  }
  for (const auto& [dtypes, seen] : recast) {  // one line for many entries (a UNet has 300)
    impl->warnings.push_back(fmt::format(
        "offload folder '{}': in-place entries stored as {} that the index says are {}: {} (the "
        "first: '{}'); accelerate casts them when it reads them, loadstone catalogs them as "
        "stored (give a dtype to cast them)",
        folder, TorchName(dtypes.first), TorchName(dtypes.second), seen.first, seen.second));
  }
  return Status::OK();
}

// `folder` as an offload folder (its index.json).
ResolvedCheckpoint OffloadFolderAt(const std::string& folder) {
  ResolvedCheckpoint offload;
  offload.format = CheckpointFormat::kOffloadFolder;
  offload.path = folder;
  offload.note = "offload folder: index.json";
  return offload;
}

// A resolved path's catalog: its files' headers, the names checked unique, config.json.
Result<Checkpoint> OpenResolved(const ResolvedCheckpoint& resolved, bool as_stored) {
  auto impl = std::make_shared<Checkpoint::Impl>();
  impl->format = resolved.format;
  if (resolved.format == CheckpointFormat::kOffloadFolder) {
    LOADSTONE_RETURN_IF_ERROR(AddOffloadFolder(resolved.path, impl.get()));
  } else if (resolved.kind == ResolvedCheckpoint::Kind::kIndex) {
    LOADSTONE_RETURN_IF_ERROR(OpenIndex(resolved.path, resolved.format, impl.get()));
  } else {
    LOADSTONE_RETURN_IF_ERROR(AddFile(resolved.format, resolved.path, impl.get()));
  }
  impl->by_name.reserve(impl->tensors.size());
  for (size_t i = 0; i < impl->tensors.size(); ++i) {
    auto [it, inserted] = impl->by_name.emplace(impl->tensors[i].name, i);
    if (!inserted) {  // only reachable without an index: one file never repeats a key
      return Status::Corruption(fmt::format("tensor '{}' appears twice", impl->tensors[i].name));
    }
  }
  const auto find = [&impl](std::string_view name) -> TensorInfo* {
    const auto it = impl->by_name.find(name);
    return it == impl->by_name.end() ? nullptr : &impl->tensors[it->second];
  };
  if (!resolved.config_dir.empty()) {
    const std::filesystem::path dir(resolved.config_dir);
    const std::string config_path = (dir / "config.json").string();
    std::error_code ec;
    if (std::filesystem::is_regular_file(config_path, ec)) {
      auto config = io::ReadModelConfig(config_path);
      if (config.ok()) {
        impl->config = std::move(*config);
      } else {
        impl->warnings.push_back(fmt::format("{}; its settings are not used",
                                             config.status().message()));
      }
    }
    // AutoGPTQ keeps its settings beside the weights when config.json has none.
    const std::string quantize_path = (dir / "quantize_config.json").string();
    if (impl->config.quant_method.empty() && std::filesystem::is_regular_file(quantize_path, ec)) {
      const Status read = io::ReadQuantizeConfig(quantize_path, &impl->config);
      if (!read.ok()) {
        impl->warnings.push_back(fmt::format("{}; its settings are not used", read.message()));
        impl->config.quant_method.clear();
      }
    }
  }
  if (!as_stored) {
    LOADSTONE_RETURN_IF_ERROR(io::CatalogBitsandbytes(impl->files, &impl->tensors, find));
    LOADSTONE_RETURN_IF_ERROR(io::CatalogPackQuantized(impl->files, &impl->tensors, find));
    LOADSTONE_RETURN_IF_ERROR(
        io::CatalogGptqAwq(impl->files, impl->config, &impl->tensors, find, &impl->warnings));
  }
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

Result<Checkpoint> Checkpoint::Open(const std::string& path, const OpenOptions& options) {
  Result<ResolvedCheckpoint> found = io::ResolveCheckpointPath(path, options);
  std::error_code probe;
  if (!found.ok() && found.status().code() == StatusCode::kNotFound && options.subfolder.empty() &&
      std::filesystem::is_regular_file(std::filesystem::path(path) / "index.json", probe)) {
    found = OffloadFolderAt(path);
  }
  LOADSTONE_ASSIGN_OR_RETURN(ResolvedCheckpoint resolved, std::move(found));
  return OpenResolved(resolved, options.as_stored);
}

Result<Checkpoint> Checkpoint::OpenOffloadFolder(const std::string& folder) {
  return OpenResolved(OffloadFolderAt(folder), /*as_stored=*/false);
}

Result<Checkpoint> Checkpoint::WithTensors(std::vector<TensorInfo> tensors) const {
  auto impl = std::make_shared<Impl>();
  impl->format = impl_->format;
  impl->files = impl_->files;
  impl->metadata = impl_->metadata;
  impl->index_path = impl_->index_path;
  impl->config = impl_->config;
  impl->resolution = fmt::format("{} tensors viewed in {}", tensors.size(), impl_->resolution);
  impl->tensors = std::move(tensors);
  for (size_t i = 0; i < impl->tensors.size(); ++i) {
    const TensorInfo& t = impl->tensors[i];
    if (t.file >= impl->files.size() || t.offset > impl->files[t.file].bytes ||
        t.nbytes > impl->files[t.file].bytes - t.offset) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}' ({} bytes at {} of file {}) is not inside a file of this checkpoint",
          t.name, t.nbytes, t.offset, t.file));
    }
    // 2^67 bits: more than any nbytes holds.
    const std::optional<Wide> bits = ShapeBits(t.dtype, t.shape, static_cast<Wide>(1) << 67);
    if (!t.packed && t.strides.empty() && (!bits || *bits != static_cast<Wide>(t.nbytes) * 8)) {
      return Status::InvalidArgument(fmt::format("tensor '{}': {} bytes for its shape and dtype",
                                                 t.name, t.nbytes));
    }
    if (!impl->by_name.emplace(t.name, i).second) {
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
const std::string& Checkpoint::resolution() const { return impl_->resolution; }
const ModelConfig& Checkpoint::config() const { return impl_->config; }
const std::vector<std::string>& Checkpoint::warnings() const { return impl_->warnings; }
uint64_t Checkpoint::total_bytes() const { return impl_->total_bytes; }
uint64_t Checkpoint::fingerprint() const { return impl_->fingerprint; }

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

}  // namespace loadstone
