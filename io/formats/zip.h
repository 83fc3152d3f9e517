// The zip archives torch.save writes (shared/specs/torch-zip.md): the central directory with
// its ZIP64 records, and where each entry's bytes lie in the file. Nothing is inflated: an entry
// that is not stored is reported as such and its bytes are never touched.
#ifndef LOADSTONE_IO_FORMATS_ZIP_H_
#define LOADSTONE_IO_FORMATS_ZIP_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/file.h"
#include "loadstone/status.h"

namespace loadstone::io {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;        // 0: stored; 8: deflated; anything else: unsupported
  uint64_t size = 0;          // uncompressed bytes
  uint64_t stored_size = 0;   // bytes in the file (compressed size)
  uint64_t data_offset = 0;   // absolute offset of the entry's first byte in the file
  uint64_t local_offset = 0;  // absolute offset of its local header
};

struct ZipArchive {
  ZipArchive() = default;
  ZipArchive(ZipArchive&&) = default;  // by_name's views stay valid: the entries do not move
  ZipArchive& operator=(ZipArchive&&) = default;
  ZipArchive(const ZipArchive&) = delete;  // a copy's by_name would view the original's names
  ZipArchive& operator=(const ZipArchive&) = delete;

  std::vector<ZipEntry> entries;  // in central-directory order
  std::unordered_map<std::string_view, size_t> by_name;  // views into entries[i].name

  const ZipEntry* Find(std::string_view name) const;
};

// Reads the central directory of `file` (the end record within the last 64 KiB + 22 bytes, its
// ZIP64 locator and record where present) and every entry's local header, and checks that each
// entry's bytes lie inside the file, before the central directory, and apart from every other
// entry's. Errors: Corruption naming the record and its byte offset (no end record, counts or
// sizes that do not fit the file, a local header that disagrees with its name, entries that
// overlap, a duplicate name).
Result<ZipArchive> ReadZipArchive(const File& file);

// True when the first bytes are a zip local-file header ("PK\3\4").
bool LooksLikeZip(std::string_view head);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_ZIP_H_
