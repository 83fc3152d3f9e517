#include "io/formats/zip.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "io/formats/limits.h"

namespace loadstone::io {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kCentralSize = 46;
constexpr size_t kLocalSize = 30;
constexpr uint64_t kMaxComment = 0xFFFF;

uint16_t U16(const std::byte* p) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(p[0]) |
                               (std::to_integer<uint16_t>(p[1]) << 8));
}
uint32_t U32(const std::byte* p) { return U16(p) | (static_cast<uint32_t>(U16(p + 2)) << 16); }
uint64_t U64(const std::byte* p) { return U32(p) | (static_cast<uint64_t>(U32(p + 4)) << 32); }

Status Bad(const File& file, uint64_t offset, std::string_view what) {
  return Status::Corruption(
      fmt::format("zip archive '{}': {} (byte {})", file.path(), what, offset));
}

// The ZIP64 extended-information extra field (id 1) replaces, in this order, each of the
// 32-bit fields that hold 0xFFFFFFFF.
Status ApplyZip64Extra(const File& file, uint64_t at, std::span<const std::byte> extra,
                       uint64_t* size, uint64_t* stored_size, uint64_t* local_offset) {
  size_t pos = 0;
  while (pos + 4 <= extra.size()) {
    const uint16_t id = U16(&extra[pos]);
    const uint16_t len = U16(&extra[pos + 2]);
    if (pos + 4 + len > extra.size()) return Bad(file, at, "an extra field runs past its record");
    if (id == 1) {
      size_t field = pos + 4;
      const size_t end = field + len;
      for (uint64_t* value : {size, stored_size, local_offset}) {
        if (*value != 0xFFFFFFFF) continue;
        if (field + 8 > end) return Bad(file, at, "a ZIP64 extra field is too short");
        *value = U64(&extra[field]);
        field += 8;
      }
      return Status::OK();
    }
    pos += 4 + len;
  }
  for (const uint64_t* value : {size, stored_size, local_offset}) {
    if (*value == 0xFFFFFFFF) return Bad(file, at, "a ZIP64 size or offset has no extra field");
  }
  return Status::OK();
}

struct Directory {
  uint64_t count = 0;
  uint64_t size = 0;
  uint64_t offset = 0;  // as recorded, relative to the archive's start
  uint64_t end = 0;     // where the directory must end in the file (its end record's position)
};

// The end-of-central-directory record, searched backwards through the file's last
// kEndSize + kMaxComment bytes for one whose comment ends the file. *in_tail: its position in
// that tail (how many bytes of the tail precede it).
Result<Directory> ReadEndRecord(const File& file, uint64_t* in_tail) {
  if (file.size() < kEndSize) return Bad(file, 0, "too short to hold an end record");
  const uint64_t tail_len = std::min<uint64_t>(file.size(), kEndSize + kMaxComment);
  const uint64_t tail_at = file.size() - tail_len;
  std::vector<std::byte> tail(tail_len);
  LOADSTONE_RETURN_IF_ERROR(file.ReadExact(tail_at, tail));
  std::optional<uint64_t> end_at;
  for (uint64_t i = tail_len - kEndSize + 1; i-- > 0;) {
    if (U32(&tail[i]) == kEndSig && i + kEndSize + U16(&tail[i + 20]) == tail_len) {
      end_at = i;
      break;
    }
  }
  if (!end_at) return Bad(file, file.size(), "no end-of-central-directory record");
  const std::byte* end = &tail[*end_at];
  Directory dir{U16(end + 10), U32(end + 12), U32(end + 16), tail_at + *end_at};
  if (U16(end + 4) != 0 || U16(end + 6) != 0) {
    return Bad(file, dir.end, "a multi-disk archive");
  }
  *in_tail = *end_at;
  return dir;
}

// The ZIP64 end record that the locator at `loc_at` points to (at `rec_at`, relative to the
// archive's start): just before the locator, or where it says when the record is longer.
Result<Directory> ReadZip64Record(const File& file, uint64_t loc_at, uint64_t rec_at) {
  // The record's recorded offset is relative to the archive start; it sits just before the
  // locator in the file, which also says how many bytes precede the archive.
  if (loc_at < kZip64EndSize) return Bad(file, loc_at, "no room for the ZIP64 end record");
  const uint64_t rec_pos = loc_at - kZip64EndSize;
  if (rec_at > rec_pos) return Bad(file, loc_at, "the ZIP64 end record lies past its locator");
  std::array<std::byte, kZip64EndSize> rec{};
  LOADSTONE_RETURN_IF_ERROR(file.ReadExact(rec_pos, rec));
  uint64_t found_at = rec_pos;
  if (U32(rec.data()) != kZip64EndSig) {
    // A record with extensible data ends later than 56 bytes from its start: it is where the
    // locator says (no bytes before the archive then).
    found_at = rec_at;
    LOADSTONE_RETURN_IF_ERROR(file.ReadExact(rec_at, rec));
    if (U32(rec.data()) != kZip64EndSig) {
      return Bad(file, rec_pos, "the ZIP64 locator points at no ZIP64 end record");
    }
  }
  if (U32(rec.data() + 16) != 0 || U32(rec.data() + 20) != 0) {
    return Bad(file, found_at, "a multi-disk ZIP64 archive");
  }
  return Directory{U64(rec.data() + 32), U64(rec.data() + 40), U64(rec.data() + 48), found_at};
}

// The directory's size and count against where it must end and loadstone's bounds.
Status CheckDirectory(const File& file, const Directory& dir) {
  if (dir.size > dir.end) {
    return Bad(file, dir.end, fmt::format("a central directory of {} bytes does not fit", dir.size));
  }
  if (dir.count > dir.size / kCentralSize) {
    return Bad(file, dir.end,
               fmt::format("{} entries cannot fit a {}-byte central directory", dir.count, dir.size));
  }
  const std::string where = fmt::format("zip directory of '{}' (end record at byte {})",
                                        file.path(), dir.end);
  if (dir.size > kZipMaxCentralDirectory) {
    return BeyondBound(where, fmt::format("a central directory of {} bytes", dir.size),
                       "kZipMaxCentralDirectory", kZipMaxCentralDirectory);
  }
  if (dir.count > kZipMaxEntries) {
    return BeyondBound(where, fmt::format("{} entries", dir.count), "kZipMaxEntries",
                       kZipMaxEntries);
  }
  return Status::OK();
}

// The central directory the end record gives, or the ZIP64 end record when a locator precedes
// the end record (required when the end record's fields are saturated), checked.
Result<Directory> FindDirectory(const File& file) {
  uint64_t in_tail = 0;
  LOADSTONE_ASSIGN_OR_RETURN(Directory dir, ReadEndRecord(file, &in_tail));
  const bool needs64 = dir.count == 0xFFFF || dir.size == 0xFFFFFFFF || dir.offset == 0xFFFFFFFF;
  if (dir.end >= kZip64LocatorSize &&
      (needs64 || in_tail >= kZip64LocatorSize)) {
    std::array<std::byte, kZip64LocatorSize> loc{};
    LOADSTONE_RETURN_IF_ERROR(file.ReadExact(dir.end - kZip64LocatorSize, loc));
    if (U32(loc.data()) == kZip64LocatorSig) {
      LOADSTONE_ASSIGN_OR_RETURN(
          dir, ReadZip64Record(file, dir.end - kZip64LocatorSize, U64(loc.data() + 8)));
    } else if (needs64) {
      return Bad(file, dir.end, "ZIP64 sizes without a ZIP64 locator");
    }
  }
  LOADSTONE_RETURN_IF_ERROR(CheckDirectory(file, dir));
  return dir;
}

// Walks a central directory entry by entry, checking each against its local header.
class EntryReader {
 public:
  // `cd`: the directory's bytes, read from `dir_at` in the file; `base`: the bytes before the
  // archive (offsets in the directory are relative to the archive's start).
  EntryReader(const File& file, const Directory& dir, uint64_t dir_at, uint64_t base,
              std::vector<std::byte> cd)
      : file_(file), dir_(dir), dir_at_(dir_at), base_(base), cd_(std::move(cd)) {}

  // Entry `i`, the next one: its central record, then its local header.
  Result<ZipEntry> Next(uint64_t i) {
    const uint64_t at = dir_at_ + pos_;
    ZipEntry e;
    uint64_t local = 0;
    LOADSTONE_RETURN_IF_ERROR(ReadCentral(i, at, &e, &local));
    LOADSTONE_RETURN_IF_ERROR(ReadLocal(at, local, &e));
    if (e.method == 0 && e.size != e.stored_size) {
      return Bad(file_, at, fmt::format("stored entry '{}' has two sizes, {} and {}", e.name,
                                        e.size, e.stored_size));
    }
    return e;
  }

 private:
  // The central record at `at` (pos_ in the directory): e's name, method and sizes (ZIP64 ones
  // applied), *local its local header's offset in the archive. Moves pos_ past the record.
  Status ReadCentral(uint64_t i, uint64_t at, ZipEntry* e, uint64_t* local) {
    if (pos_ + kCentralSize > cd_.size() || U32(&cd_[pos_]) != kCentralSig) {
      return Bad(file_, at, fmt::format("central-directory entry {} is missing", i));
    }
    const std::byte* h = &cd_[pos_];
    const uint16_t flags = U16(h + 8);
    e->method = U16(h + 10);
    e->stored_size = U32(h + 20);
    e->size = U32(h + 24);
    const size_t name_len = U16(h + 28), extra_len = U16(h + 30), comment_len = U16(h + 32);
    *local = U32(h + 42);
    if (pos_ + kCentralSize + name_len + extra_len + comment_len > cd_.size()) {
      return Bad(file_, at, "a central-directory entry runs past the directory");
    }
    if (flags & 1) return Bad(file_, at, "an encrypted entry");
    e->name.assign(reinterpret_cast<const char*>(h + kCentralSize), name_len);
    LOADSTONE_RETURN_IF_ERROR(ApplyZip64Extra(
        file_, at, std::span<const std::byte>(h + kCentralSize + name_len, extra_len), &e->size,
        &e->stored_size, local));
    pos_ += kCentralSize + name_len + extra_len + comment_len;
    return Status::OK();
  }

  // The local header at `local` (in the archive) of the entry whose central record is at
  // `at`: inside the archive, naming the same entry. Sets e's local and data offsets, its
  // data checked to end before the central directory.
  Status ReadLocal(uint64_t at, uint64_t local, ZipEntry* e) {
    const size_t name_len = e->name.size();
    if (local > dir_.offset || dir_.offset - local < kLocalSize) {
      return Bad(file_, at, fmt::format("entry '{}' has its local header at {}, outside the archive",
                                        e->name, local));
    }
    std::vector<std::byte> lh(kLocalSize + name_len);
    if (dir_.offset - local < lh.size()) {
      return Bad(file_, base_ + local, fmt::format("entry '{}' has no room for its local header",
                                                   e->name));
    }
    LOADSTONE_RETURN_IF_ERROR(file_.ReadExact(base_ + local, lh));
    if (U32(lh.data()) != kLocalSig) {
      return Bad(file_, base_ + local, fmt::format("entry '{}' has no local header", e->name));
    }
    const uint64_t local_name = U16(lh.data() + 26), local_extra = U16(lh.data() + 28);
    if (local_name != name_len ||
        std::memcmp(lh.data() + kLocalSize, e->name.data(), name_len) != 0) {
      return Bad(file_, base_ + local,
                 fmt::format("entry '{}': its local header names another entry", e->name));
    }
    e->local_offset = base_ + local;
    e->data_offset = base_ + local + kLocalSize + local_name + local_extra;
    if (e->data_offset > dir_at_ || dir_at_ - e->data_offset < e->stored_size) {
      return Bad(file_, base_ + local,
                 fmt::format("entry '{}' ({} bytes at {}) runs into the central directory",
                             e->name, e->stored_size, e->data_offset));
    }
    return Status::OK();
  }

  const File& file_;
  const Directory& dir_;
  const uint64_t dir_at_;
  const uint64_t base_;
  const std::vector<std::byte> cd_;
  size_t pos_ = 0;  // the next central record, in cd_
};

// No two entries share bytes (one storage's entry cannot alias another's, or data.pkl).
Status CheckNoOverlap(const File& file, const std::vector<ZipEntry>& entries) {
  std::vector<const ZipEntry*> by_offset;
  for (const ZipEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipEntry* a, const ZipEntry* b) { return a->local_offset < b->local_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipEntry& prev = *by_offset[i - 1];
    if (by_offset[i]->local_offset < prev.data_offset + prev.stored_size) {
      return Bad(file, by_offset[i]->local_offset,
                 fmt::format("entries '{}' and '{}' overlap", prev.name, by_offset[i]->name));
    }
  }
  return Status::OK();
}

}  // namespace

bool LooksLikeZip(std::string_view head) {
  return head.size() >= 4 && head.substr(0, 4) == std::string_view("PK\x03\x04", 4);
}

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &entries[it->second];
}

Result<ZipArchive> ReadZipArchive(const File& file) {
  LOADSTONE_ASSIGN_OR_RETURN(Directory dir, FindDirectory(file));
  const uint64_t dir_at = dir.end - dir.size;  // where the directory is in the file
  if (dir.offset > dir_at) return Bad(file, dir.end, "the central directory offset is past its end");
  const uint64_t base = dir_at - dir.offset;   // bytes before the archive (a prefix), usually 0
  std::vector<std::byte> cd(dir.size);
  LOADSTONE_RETURN_IF_ERROR(file.ReadExact(dir_at, cd));

  ZipArchive archive;
  archive.entries.reserve(dir.count);
  EntryReader reader(file, dir, dir_at, base, std::move(cd));
  for (uint64_t i = 0; i < dir.count; ++i) {
    LOADSTONE_ASSIGN_OR_RETURN(ZipEntry e, reader.Next(i));
    archive.entries.push_back(std::move(e));
  }
  LOADSTONE_RETURN_IF_ERROR(CheckNoOverlap(file, archive.entries));
  archive.by_name.reserve(archive.entries.size());
  for (size_t i = 0; i < archive.entries.size(); ++i) {
    if (!archive.by_name.emplace(archive.entries[i].name, i).second) {
      return Bad(file, dir_at, fmt::format("entry '{}' appears twice", archive.entries[i].name));
    }
  }
  return archive;
}

}  // namespace loadstone::io
