// Reading a resolved checkpoint path's files into the catalog: one file by its format (a GGUF
// split set as a whole), the shards of an index checked against it, an offload folder.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/checkpoint_impl.h"
#include "io/file.h"
#include "io/formats/gguf.h"
#include "io/formats/hf_index.h"
#include "io/formats/offload_folder.h"
#include "io/formats/safetensors.h"
#include "io/formats/sniff.h"
#include "io/formats/torch_zip.h"
#include "io/http_reader.h"
#include "io/location.h"
#include "io/shard_reader.h"

namespace loadstone::io {
namespace {

// A header the safetensors rules refuse, with what the file is when its first bytes say so
// (a GGUF file or a zip archive named .safetensors gets more than "HeaderTooLarge").
Status NameForeignFormat(const File& file, Status refused) {
  std::array<std::byte, 8> head{};
  if (file.size() < head.size() || !file.ReadExact(0, head).ok()) return refused;
  const std::string what = ForeignFormat(head);
  if (what.empty()) return refused;
  return Status(refused.code(), fmt::format("{}; {}", refused.message(), what));
}

// Appends one file's header to `impl`; the file's index is impl->files.size().
void AddTensors(const File& file, std::vector<TensorInfo> tensors, Checkpoint::Impl* impl) {
  const auto file_index = static_cast<uint32_t>(impl->files.size());
  impl->files.push_back({file.path(), file.size(), file.stamp()});
  for (TensorInfo& t : tensors) {
    t.file = file_index;
    impl->total_bytes += t.nbytes;
  }
  if (impl->tensors.empty()) {  // the first file's: taken whole
    impl->tensors = std::move(tensors);
    return;
  }
  for (TensorInfo& t : tensors) impl->tensors.push_back(std::move(t));
}

Status AddSafetensorsFile(const std::string& path, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  auto parsed = ReadSafetensorsHeader(file);
  if (!parsed.ok()) return NameForeignFormat(file, parsed.status());
  SafetensorsHeader header = std::move(*parsed);
  for (auto& [key, value] : header.metadata) impl->metadata.emplace(key, value);
  AddTensors(file, std::move(header.tensors), impl);
  return Status::OK();
}

Status AddTorchFile(const std::string& path, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  LOADSTONE_ASSIGN_OR_RETURN(TorchArchive archive, ReadTorchArchive(file));
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
  LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  LOADSTONE_ASSIGN_OR_RETURN(GgufFile gguf, ReadGgufHeader(file));
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
    const Status added = MayBeThere(part)
                             ? AddGgufFile(part, std::pair{i - 1, count}, impl)  // split.no from 0
                             : Status::NotFound("");
    if (added.code() == StatusCode::kNotFound) {
      return Status::NotFound(fmt::format("split {} of {} of '{}' is missing: '{}'", i, count,
                                          path, part));
    }
    LOADSTONE_RETURN_IF_ERROR(added);
  }
  const auto total = impl->metadata.find("split.tensors.count");
  if (total != impl->metadata.end() && total->second != std::to_string(impl->tensors.size())) {
    return Status::Corruption(fmt::format(
        "the split set of '{}' says split.tensors.count = {}, but its {} files hold {} tensors",
        path, total->second, count, impl->tensors.size()));
  }
  return Status::OK();
}

}  // namespace

Status AddCheckpointFile(CheckpointFormat format, const std::string& path, Checkpoint::Impl* impl) {
  switch (format) {
    case CheckpointFormat::kSafetensors: return AddSafetensorsFile(path, impl);
    case CheckpointFormat::kPyTorch: return AddTorchFile(path, impl);
    case CheckpointFormat::kGguf: return AddGgufSet(path, impl);
    case CheckpointFormat::kOffloadFolder: break;  // AddOffloadFolder, not file by file
  }
  return Status::Unsupported(fmt::format("'{}': unknown checkpoint format", path));
}

namespace {

// What is wrong between an index and its shards: the first shard tensor (in file order) that is
// in two shards, that the index does not list, or that it maps to another shard; else the mapped
// tensor (the first by name) that no shard holds. OK when nothing is.
Status IndexMismatch(const ShardIndex& index, const Checkpoint::Impl& impl) {
  // Files were added in the order of index.shards: file i is shard i.
  std::unordered_map<std::string_view, uint32_t> where;  // tensor → file index
  where.reserve(impl.tensors.size());
  for (const TensorInfo& t : impl.tensors) {
    auto [it, inserted] = where.emplace(t.name, t.file);
    if (!inserted) {
      return Status::Corruption(fmt::format(
          "tensor '{}' is in two shards, '{}' and '{}' (index '{}')", t.name,
          impl.files[it->second].path, impl.files[t.file].path, index.path));
    }
    const std::optional<uint32_t> shard = index.ShardOf(t.name);
    if (!shard) {
      return Status::Corruption(fmt::format(
          "shard '{}' holds tensor '{}' (offset {}), which index '{}' does not list",
          impl.files[t.file].path, t.name, t.offset, index.path));
    }
    if (*shard != t.file) {
      return Status::Corruption(fmt::format(
          "index '{}' maps tensor '{}' to '{}', but it is in shard '{}'", index.path, t.name,
          index.shards[*shard], impl.files[t.file].path));
    }
  }
  const std::pair<std::string, uint32_t>* missing = nullptr;
  for (const auto& entry : index.weight_map) {
    if (!where.count(entry.first) && (missing == nullptr || entry.first < missing->first)) {
      missing = &entry;
    }
  }
  if (missing == nullptr) return Status::OK();
  return Status::Corruption(fmt::format(
      "index '{}' maps tensor '{}' to shard '{}', which does not hold it", index.path,
      missing->first, index.shards[missing->second]));
}

// Every mapped tensor is in its shard, every shard tensor is mapped to that shard, no tensor
// is in two shards. One lookup per tensor when that holds: each shard tensor found mapped to
// its own shard, and as many of them as the index maps, is every mapped tensor once (one shard
// never holds a name twice, so two that match are two mapped names).
Status CheckIndexAgainstShards(const ShardIndex& index, const Checkpoint::Impl& impl) {
  size_t matched = 0;
  for (const TensorInfo& t : impl.tensors) {
    if (index.ShardOf(t.name) != t.file) break;
    ++matched;
  }
  if (matched == impl.tensors.size() && matched == index.weight_map.size()) return Status::OK();
  return IndexMismatch(index, impl);
}

Status OpenIndex(const std::string& index_path, CheckpointFormat format, Checkpoint::Impl* impl) {
  ShardReader shards(format, ParentLocation(index_path), index_path);
  LOADSTONE_ASSIGN_OR_RETURN(
      ShardIndex index,
      ReadShardIndex(index_path, [&shards](const std::string& name) { shards.Add(name); }));
  LOADSTONE_RETURN_IF_ERROR(shards.Finish(index.shards, impl));
  LOADSTONE_RETURN_IF_ERROR(CheckIndexAgainstShards(index, *impl));
  impl->index_path = index_path;
  return Status::OK();
}

// An offload folder's entries added to a catalog: each NAME.dat a file of its own (at least as
// long as its tensor), each safetensors reference the tensor of that file's header, renamed to
// its entry. Add() each entry in the index's order, then WarnRecasts() once.
class OffloadFolderCatalog {
 public:
  OffloadFolderCatalog(const std::string& folder, Checkpoint::Impl* impl)
      : folder_(folder), impl_(impl) {}

  Status Add(const OffloadIndexEntry& e) {
    return e.safetensors_file.empty() ? AddDataFile(e) : AddReference(e);
  }

  // One warning per (stored, index's) dtype pair of the in-place entries whose index names
  // another dtype than their file stores (one line for many entries: a UNet has 300).
  void WarnRecasts() const {
    for (const auto& [dtypes, seen] : recast_) {
      impl_->warnings.push_back(fmt::format(
          "offload folder '{}': in-place entries stored as {} that the index says are {}: {} (the "
          "first: '{}'); accelerate casts them when it reads them, loadstone catalogs them as "
          "stored (give a dtype to cast them)",
          folder_, TorchName(dtypes.first), TorchName(dtypes.second), seen.first, seen.second));
    }
  }

 private:
  using Header = std::pair<uint32_t, std::vector<TensorInfo>>;  // file index, its tensors

  // The header of the safetensors file at `path`, read (and the file added to the catalog)
  // the first time an entry refers to it.
  Result<const Header*> HeaderOf(const std::string& path) {
    auto it = headers_.find(path);
    if (it == headers_.end()) {
      LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
      auto parsed = ReadSafetensorsHeader(file);
      if (!parsed.ok()) return NameForeignFormat(file, parsed.status());
      const auto index = static_cast<uint32_t>(impl_->files.size());
      impl_->files.push_back({path, file.size(), file.stamp()});
      it = headers_.emplace(path, Header{index, std::move(parsed->tensors)}).first;
    }
    return &it->second;
  }

  // An in-place entry: the tensor `e.weight_name` of `e.safetensors_file`, named `e.name`.
  Status AddReference(const OffloadIndexEntry& e) {
    LOADSTONE_ASSIGN_OR_RETURN(const Header* header, HeaderOf(e.safetensors_file));
    const auto& [file_index, tensors] = *header;
    auto t = std::find_if(tensors.begin(), tensors.end(),
                          [&](const TensorInfo& x) { return x.name == e.weight_name; });
    if (t == tensors.end()) {
      return Status::Corruption(fmt::format(
          "offload folder '{}': entry '{}' names tensor '{}' of '{}', which that file does not "
          "hold",
          folder_, e.name, e.weight_name, e.safetensors_file));
    }
    TensorInfo info = *t;
    info.name = e.name;
    info.file = file_index;
    if (e.dtype && *e.dtype != info.dtype) {
      auto& [count, first] = recast_[{info.dtype, *e.dtype}];
      if (count++ == 0) first = e.name;
    }
    impl_->total_bytes += info.nbytes;
    impl_->tensors.push_back(std::move(info));
    return Status::OK();
  }

  // A NAME.dat entry: its size from dtype and shape, below 2^59 bytes, and the file at least
  // that long.
  Status AddDataFile(const OffloadIndexEntry& e) {
    const std::string path = OffloadDataPath(folder_, e.name);
    const std::optional<Wide> bits = ShapeBits(*e.dtype, e.shape, static_cast<Wide>(1) << 62);
    if (!bits || *bits % 8 != 0) {
      return Status::Corruption(fmt::format(
          "offload folder '{}': entry '{}' has shape and dtype {} whose size is not a whole "
          "number of bytes below 2^59",
          folder_, e.name, TorchName(*e.dtype)));
    }
    const auto nbytes = static_cast<uint64_t>(*bits / 8);
    LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
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
    AddTensors(file, {std::move(info)}, impl_);
    return Status::OK();
  }

  const std::string& folder_;
  Checkpoint::Impl* impl_;
  std::unordered_map<std::string, Header> headers_;  // by safetensors path
  // In-place entries whose index names another dtype: (stored, index's) → count, the first.
  std::map<std::pair<DType, DType>, std::pair<size_t, std::string>> recast_;
};

Status AddOffloadFolder(const std::string& folder, Checkpoint::Impl* impl) {
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<OffloadIndexEntry> entries,
                             ReadOffloadIndex(folder));
  OffloadFolderCatalog catalog(folder, impl);
  for (const OffloadIndexEntry& e : entries) LOADSTONE_RETURN_IF_ERROR(catalog.Add(e));
  catalog.WarnRecasts();
  return Status::OK();
}

}  // namespace

Status AddCheckpointFiles(const ResolvedCheckpoint& resolved, Checkpoint::Impl* impl) {
  if (resolved.format == CheckpointFormat::kOffloadFolder) {
    return AddOffloadFolder(resolved.path, impl);
  }
  if (resolved.kind == ResolvedCheckpoint::Kind::kIndex) {
    return OpenIndex(resolved.path, resolved.format, impl);
  }
  return AddCheckpointFile(resolved.format, resolved.path, impl);
}


}  // namespace loadstone::io
