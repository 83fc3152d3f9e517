// OpenReader: opens the files and picks the backend (io_uring, else pread).
#include "io/reader.h"

#include <sys/mman.h>

#include <algorithm>

#include <fmt/format.h>

#include "io/file.h"
#include "io/http_reader.h"
#include "io/hub_cache.h"
#include "io/pread_reader.h"
#include "io/read_state.h"
#include "io/uring_reader.h"

namespace loadstone::io {

void ReleaseCachedView(const std::byte* view, uint64_t length) {
  const uint64_t page = 4096;
  const uint64_t begin = (reinterpret_cast<uint64_t>(view) + page - 1) / page * page;
  const uint64_t end = (reinterpret_cast<uint64_t>(view) + length) / page * page;
  // Advice on a read-only shared mapping: it only unmaps; failure changes nothing.
  if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

namespace {

Result<std::vector<File>> OpenAll(const std::vector<std::string>& paths,
                                  const std::vector<CheckpointFile>& catalogued) {
  std::vector<File> files;
  files.reserve(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(paths[i]));
    if (!catalogued.empty()) LOADSTONE_RETURN_IF_ERROR(CheckUnchanged(file, catalogued[i]));
    files.push_back(std::move(file));
  }
  return files;
}

Result<std::unique_ptr<Reader>> OpenPread(std::vector<File> files, const ReaderOptions& options,
                                          std::string_view why, std::string* log) {
  LOADSTONE_ASSIGN_OR_RETURN(std::unique_ptr<PreadReader> reader,
                             PreadReader::Create(std::move(files), options));
  if (log != nullptr) *log = fmt::format("reader: {}; {}", reader->Describe(), why);
  return std::unique_ptr<Reader>(std::move(reader));
}

// The objects behind http(s) addresses, each the version the catalog read (size, validator).
Result<std::unique_ptr<Reader>> OpenRemote(const std::vector<std::string>& paths,
                                           const ReaderOptions& options, std::string* log) {
  HttpReaderOptions http;
  http.hub_cache = options.hub_cache;
  LOADSTONE_ASSIGN_OR_RETURN(std::unique_ptr<HttpReader> reader, HttpReader::Open(paths, http));
  for (size_t i = 0; i < options.catalogued.size(); ++i) {
    const HttpObject& now = reader->objects()[i];
    const CheckpointFile& then = options.catalogued[i];
    const std::string& version = now.version();
    // A catalog made by hand knows no version: then only the size is checked.
    const bool other = !then.stamp.validator.empty() && then.stamp.validator != version;
    if (now.size != then.bytes || other) {
      return Status::Corruption(fmt::format(
          "'{}' changed since its header was read ({} bytes, version {} then; {} bytes, version "
          "{} now): open the checkpoint again",
          paths[i], then.bytes, then.stamp.validator, now.size, version));
    }
  }
  if (log != nullptr) {
    *log = fmt::format("reader: {}; the files are remote{}", reader->Describe(),
                       options.hub_cache
                           ? fmt::format(", written to the cache '{}' as they stream", options.hub_cache->root)
                           : std::string());
  }
  return std::unique_ptr<Reader>(std::move(reader));
}

}  // namespace

Result<std::unique_ptr<Reader>> OpenReader(const std::vector<std::string>& paths,
                                           const ReaderOptions& options, std::string* log) {
  LOADSTONE_RETURN_IF_ERROR(CheckOptions(options));
  if (!options.catalogued.empty() && options.catalogued.size() != paths.size()) {
    return Status::InvalidArgument(fmt::format("the reader was given {} catalogued files for {} paths",
                                               options.catalogued.size(), paths.size()));
  }
  const auto remote = std::count_if(paths.begin(), paths.end(),
                                    [](const std::string& p) { return IsRemoteAddress(p); });
  if (remote != 0 && static_cast<size_t>(remote) != paths.size()) {
    return Status::Unsupported(fmt::format(
        "{} of the {} files are remote (http(s) addresses) and the others local: one load reads "
        "files of one kind",
        remote, paths.size()));
  }
  if (remote != 0) return OpenRemote(paths, options, log);
  if (options.hub_cache && !paths.empty()) {
    return NotAHubFile(paths[0], true);
  }
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<File> files, OpenAll(paths, options.catalogued));
  if (options.backend == ReaderBackend::kPread) {
    return OpenPread(std::move(files), options, "asked for (--backend pread)", log);
  }
  Status probe = UringReader::Probe();
  if (probe.ok()) {
    Result<std::unique_ptr<UringReader>> uring = UringReader::Create(std::move(files), options);
    if (uring.ok()) {
      if (log != nullptr) {
        *log = fmt::format("reader: {}; {}", (*uring)->Describe(),
                           options.backend == ReaderBackend::kUring ? "asked for (--backend uring)"
                                                                    : "the probe created a ring");
      }
      return std::unique_ptr<Reader>(std::move(uring).value());
    }
    // A ring could be made but not this one (its depth, memory): the files are fine, so only
    // an Unsupported setup error may fall back.
    if (uring.status().code() != StatusCode::kUnsupported) return uring.status();
    probe = uring.status();
    // Create() took the first ones.
    LOADSTONE_ASSIGN_OR_RETURN(files, OpenAll(paths, options.catalogued));
  }
  if (options.backend == ReaderBackend::kUring) {
    return Status::InvalidArgument(fmt::format(
        "--backend uring: io_uring is unavailable here: {}; use --backend auto or pread",
        probe.message()));
  }
  return OpenPread(std::move(files), options,
                   fmt::format("io_uring unavailable: {}", probe.message()), log);
}

}  // namespace loadstone::io
