#include "io/formats/torch_zip.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/formats/limits.h"
#include "io/formats/torch_pickle.h"
#include "io/formats/zip.h"

namespace loadstone::io {
namespace {

__extension__ using u128 = unsigned __int128;
constexpr u128 kMaxBytes = static_cast<u128>(UINT64_MAX);

// A pre-1.6 torch.save file: a pickle (protocol 2) whose first value is the LONG1 magic number
// 0x1950a86a20f9469cfc6c.
bool LooksLikeLegacyTorch(std::span<const std::byte> head) {
  static constexpr std::array<uint8_t, 4> kStart = {0x80, 0x02, 0x8a, 0x0a};
  if (head.size() < kStart.size()) return false;
  for (size_t i = 0; i < kStart.size(); ++i) {
    if (std::to_integer<uint8_t>(head[i]) != kStart[i]) return false;
  }
  return true;
}

// A storage key names one entry under data/: a plain name, never a path.
bool IsPlainKey(std::string_view key) {
  return !key.empty() && key != "." && key != ".." && key.find('/') == std::string_view::npos &&
         key.find('\\') == std::string_view::npos && key.find('\0') == std::string_view::npos;
}

// Entry `entry` read whole, when it is at most `limit` bytes (the value of the bound `bound`).
Result<std::string> ReadSmallEntry(const File& file, const ZipEntry& entry, uint64_t limit,
                                   std::string_view bound) {
  if (entry.method != 0) {
    return Status::Unsupported(fmt::format("'{}': entry '{}' is compressed (method {}); torch.save "
                                           "stores every entry",
                                           file.path(), entry.name, entry.method));
  }
  if (entry.size > limit) {
    return BeyondBound(fmt::format("'{}' (entry '{}' at byte {})", file.path(), entry.name,
                                   entry.local_offset),
                       fmt::format("an entry of {} bytes", entry.size), bound, limit);
  }
  std::string bytes(entry.size, '\0');
  LOADSTONE_RETURN_IF_ERROR(
      file.ReadExact(entry.data_offset, std::as_writable_bytes(std::span(bytes))));
  return bytes;
}

Status Bad(const File& file, std::string_view what) {
  return Status::Corruption(fmt::format("'{}': {}", file.path(), what));
}

// The C-order strides of `size`; a dimension of size 1 may carry any stride (torch's rule).
bool IsContiguous(const std::vector<uint64_t>& size, const std::vector<uint64_t>& stride) {
  uint64_t expected = 1;
  for (size_t d = size.size(); d-- > 0;) {
    if (size[d] != 1 && stride[d] != expected) return false;
    expected *= size[d];
  }
  return true;
}

// Unsupported for a pre-1.6 torch.save file, recognised by its first bytes.
Status RefuseLegacy(const File& file) {
  std::array<std::byte, 8> head{};
  if (file.size() >= head.size()) LOADSTONE_RETURN_IF_ERROR(file.ReadExact(0, head));
  if (LooksLikeLegacyTorch(head)) {
    return Status::Unsupported(fmt::format(
        "'{}' is a legacy torch.save checkpoint (PyTorch before 1.6: a pickle with its storages "
        "appended), which loadstone does not read; re-save it with a current PyTorch "
        "(torch.save(torch.load(f), f2)) or convert it to safetensors",
        file.path()));
  }
  return Status::OK();
}

// The archive folder every entry is under ("archive/"), taken from the first entry; a
// TorchScript archive (code/ or constants.pkl under it) is Unsupported.
Result<std::string> ArchivePrefix(const File& file, const ZipArchive& zip) {
  if (zip.entries.empty()) return Bad(file, "an empty zip archive, not a torch.save checkpoint");
  const std::string& first = zip.entries.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    return Bad(file, fmt::format("entry '{}' is not under an archive folder, as torch.save "
                                 "writes every entry", first));
  }
  const std::string prefix = first.substr(0, slash + 1);
  if (zip.Find(prefix + "constants.pkl") ||
      std::any_of(zip.entries.begin(), zip.entries.end(),
                  [&](const ZipEntry& e) { return e.name.starts_with(prefix + "code/"); })) {
    return Status::Unsupported(fmt::format(
        "'{}' is a TorchScript archive (torch.jit.save: it holds code/ and constants.pkl), not a "
        "torch.save checkpoint; save its state dict with torch.save(torch.jit.load(f)."
        "state_dict(), f2) and load that",
        file.path()));
  }
  return prefix;
}

// The archive's byteorder entry, when it has one: "little" (the default) or "big".
Status ReadByteorder(const File& file, const ZipArchive& zip, const std::string& prefix,
                     bool* big_endian) {
  const ZipEntry* order = zip.Find(prefix + "byteorder");
  if (!order) return Status::OK();
  LOADSTONE_ASSIGN_OR_RETURN(std::string text, ReadSmallEntry(file, *order, kTorchMaxByteorder,
                                                              "kTorchMaxByteorder"));
  if (text == "big") {
    *big_endian = true;
  } else if (text != "little") {
    return Bad(file, fmt::format("entry '{}' says '{}', not 'little' or 'big'", order->name,
                                 text));
  }
  return Status::OK();
}

// What the unpickler accepted or left out that the user should hear of.
void AddNotes(const PickledStateDict& dict, std::vector<std::string>* notes) {
  if (!dict.state_dict_key.empty()) {
    notes->push_back(fmt::format("the state dict under key '{}'", dict.state_dict_key));
  }
  if (!dict.skipped.empty()) {
    notes->push_back(fmt::format("{} entr{} that are not tensors left out: {}",
                                 dict.skipped.size(), dict.skipped.size() == 1 ? "y" : "ies",
                                 fmt::join(dict.skipped, ", ")));
  }
  if (dict.protocol4_opcodes) {
    notes->push_back("pickle protocol-4 opcodes accepted (torch.load(weights_only=True) "
                     "refuses them)");
  }
}

// A storage's entry and its own size in bytes (at most the entry's size).
struct StorageSpan {
  const ZipEntry* entry = nullptr;
  uint64_t bytes = 0;
};

// Each storage: its entry under PREFIX/data/, stored (not compressed), and long enough.
Result<std::vector<StorageSpan>> FindStorages(const File& file, const ZipArchive& zip,
                                              const std::string& prefix,
                                              const std::vector<PickledStorage>& storages) {
  std::vector<StorageSpan> spans(storages.size());
  for (size_t s = 0; s < storages.size(); ++s) {
    const PickledStorage& st = storages[s];
    if (!IsPlainKey(st.key)) {
      return Bad(file, fmt::format("storage key '{}' is not a plain entry name", st.key));
    }
    const ZipEntry* entry = zip.Find(prefix + "data/" + st.key);
    if (!entry) {
      return Bad(file, fmt::format("storage '{}' has no entry '{}data/{}'", st.key, prefix, st.key));
    }
    if (entry->method != 0) {
      return Status::Unsupported(fmt::format(
          "'{}': storage entry '{}' is compressed ({} bytes that would inflate to {}); torch.save "
          "stores storages, and loadstone refuses to inflate one",
          file.path(), entry->name, entry->stored_size, entry->size));
    }
    const u128 bytes = st.untyped ? static_cast<u128>(st.numel)
                                  : static_cast<u128>(st.numel) * (DTypeBits(st.dtype) / 8);
    if (bytes > entry->size) {
      return Bad(file, fmt::format("storage '{}' claims {} elements of {}, more than the {} bytes "
                                   "of entry '{}'", st.key, st.numel, TorchName(st.dtype),
                                   entry->size, entry->name));
    }
    spans[s] = {entry, static_cast<uint64_t>(bytes)};
  }
  return spans;
}

// What the tensors would take once loaded, against what the file holds: views may repeat a
// storage (tied weights: twice), not a thousand times over.
class LoadedBudget {
 public:
  explicit LoadedBudget(const File& file)
      : file_(file), limit_(static_cast<u128>(file.size()) * 16 + (1ULL << 30)) {}

  // Counts `bytes` more; Unsupported once the total is past the limit.
  Status Take(u128 bytes) {
    loaded_ += bytes;
    if (loaded_ > limit_) {
      return Status::Unsupported(fmt::format(
          "'{}': its tensors would take more than {} bytes once loaded from a file of {} (views "
          "that repeat storages many times over); loadstone refuses such files",
          file_.path(), static_cast<uint64_t>(limit_), file_.size()));
    }
    return Status::OK();
  }

 private:
  const File& file_;
  const u128 limit_;
  u128 loaded_ = 0;
};

// A tensor's element count and the element index of its last element, refused once its bytes
// pass 63 bits or its strides reach past 2^64.
struct Extent {
  u128 numel = 1;
  u128 last = 0;
};

Result<Extent> ExtentOf(const File& file, const PickledTensor& pt, uint64_t es) {
  Extent x;
  x.last = pt.offset;
  for (size_t d = 0; d < pt.size.size(); ++d) {
    x.numel *= pt.size[d];
    if (x.numel * es > static_cast<u128>(INT64_MAX)) {
      return Bad(file, fmt::format("tensor '{}' takes more bytes than fit 63 bits", pt.name));
    }
    if (pt.size[d] > 0) x.last += static_cast<u128>(pt.size[d] - 1) * pt.stride[d];
    if (x.last > kMaxBytes) {
      return Bad(file, fmt::format("tensor '{}': its strides reach past 2^64", pt.name));
    }
  }
  return x;
}

// Tensor `pt` of storage `st` as a catalog entry: a whole-byte dtype, inside its storage's own
// size, counted against `budget`. Takes pt's name, size and stride.
Result<TensorInfo> PlaceTensor(const File& file, PickledTensor& pt, const PickledStorage& st,
                               const StorageSpan& storage, bool big_endian, LoadedBudget* budget) {
  const int bits = DTypeBits(pt.dtype);
  if (bits % 8 != 0) {
    return Status::Unsupported(fmt::format("'{}': tensor '{}' has dtype {}, which loadstone "
                                           "does not read from .bin files", file.path(), pt.name,
                                           TorchName(pt.dtype)));
  }
  const uint64_t es = static_cast<uint64_t>(bits / 8);
  LOADSTONE_ASSIGN_OR_RETURN(const Extent x, ExtentOf(file, pt, es));
  TensorInfo t;
  t.name = std::move(pt.name);
  t.dtype = pt.dtype;
  t.shape = std::move(pt.size);
  t.storage = storage.entry->name;
  t.big_endian = big_endian && es > 1;
  // Against the storage's own size (its numel), which its entry holds (checked before).
  const uint64_t held = storage.bytes;
  const u128 begin = static_cast<u128>(pt.offset) * es;
  const u128 end = x.numel == 0 ? begin : (x.last + 1) * es;
  if (x.numel > 0 && end > held) {
    return Bad(file, fmt::format(
        "tensor '{}' (offset {}, size [{}], stride [{}]) reaches byte {} of storage '{}', "
        "which holds {} bytes", t.name, pt.offset, fmt::join(t.shape, ", "),
        fmt::join(pt.stride, ", "), static_cast<uint64_t>(end), st.key,
        held));
  }
  if (x.numel == 0 && begin > held) {
    return Bad(file, fmt::format("tensor '{}' starts at byte {} of storage '{}', which holds {}",
                                 t.name, static_cast<uint64_t>(begin), st.key,
                                 held));
  }
  LOADSTONE_RETURN_IF_ERROR(budget->Take(x.numel * es));
  t.offset = storage.entry->data_offset + static_cast<uint64_t>(begin);
  t.nbytes = static_cast<uint64_t>(end - begin);
  if (x.numel > 0 && !IsContiguous(t.shape, pt.stride)) t.strides = std::move(pt.stride);
  return t;
}

}  // namespace

Result<TorchArchive> ReadTorchArchive(const File& file) {
  LOADSTONE_RETURN_IF_ERROR(RefuseLegacy(file));
  LOADSTONE_ASSIGN_OR_RETURN(ZipArchive zip, ReadZipArchive(file));
  LOADSTONE_ASSIGN_OR_RETURN(const std::string prefix, ArchivePrefix(file, zip));
  const ZipEntry* pkl = zip.Find(prefix + "data.pkl");
  if (!pkl) {
    return Bad(file, fmt::format("no '{}data.pkl' entry: not a torch.save checkpoint", prefix));
  }
  TorchArchive out;
  LOADSTONE_RETURN_IF_ERROR(ReadByteorder(file, zip, prefix, &out.big_endian));
  LOADSTONE_ASSIGN_OR_RETURN(std::string pickle, ReadSmallEntry(file, *pkl, kTorchMaxPickle,
                                                                   "kTorchMaxPickle"));
  LOADSTONE_ASSIGN_OR_RETURN(PickledStateDict dict,
                             ParseTorchPickle(pickle, file.path() + ":" + pkl->name));
  AddNotes(dict, &out.notes);
  LOADSTONE_ASSIGN_OR_RETURN(const std::vector<StorageSpan> storages,
                             FindStorages(file, zip, prefix, dict.storages));
  LoadedBudget budget(file);
  out.tensors.reserve(dict.tensors.size());
  for (PickledTensor& pt : dict.tensors) {
    LOADSTONE_ASSIGN_OR_RETURN(TensorInfo t,
                               PlaceTensor(file, pt, dict.storages[pt.storage],
                                           storages[pt.storage], out.big_endian, &budget));
    out.tensors.push_back(std::move(t));
  }
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.offset, a.name) < std::tie(b.offset, b.name);
  });
  return out;
}

}  // namespace loadstone::io
