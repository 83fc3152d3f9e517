// MeasureRawRead: the read ceiling of the storage under the files, for benchmarks.
#include <poll.h>

#include <chrono>

#include "io/file.h"
#include "io/reader.h"
#include "loadstone/diagnostics.h"
#include "runtime/pipeline/host_buffer.h"

namespace loadstone {

Result<RawReadResult> MeasureRawRead(const std::vector<std::string>& paths,
                                     const RawReadOptions& options) {
  io::ReaderOptions ro;
  ro.backend = io::ReaderBackend::kUring;
  ro.queue_depth = options.queue_depth;
  ro.max_chunk = options.chunk;
  ro.direct = options.direct;
  LOADSTONE_ASSIGN_OR_RETURN(auto reader, io::OpenReader(paths, ro));
  std::vector<uint64_t> sizes;
  for (const std::string& path : paths) {
    LOADSTONE_ASSIGN_OR_RETURN(io::File f, io::File::OpenForRead(path));
    sizes.push_back(f.size());
  }
  const size_t slots = static_cast<size_t>(options.queue_depth);
  // Huge pages, like the Loader's staging: physically contiguous memory lets the block layer
  // send large requests, and the ceiling is the disk's rather than the page size's
  // (docs/pipeline.md).
  LOADSTONE_ASSIGN_OR_RETURN(auto scratch, pipeline::AllocateHost(slots * options.chunk, nullptr,
                                                                  pipeline::HostPages::kHuge));

  RawReadResult result;
  result.backend = reader->Describe();
  std::vector<size_t> free_slots;
  for (size_t i = 0; i < slots; ++i) free_slots.push_back(i);
  std::vector<io::ReadCompletion> done;
  size_t file = 0;
  uint64_t offset = 0;
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    std::vector<io::ReadRequest> batch;
    while (!free_slots.empty() && file < sizes.size()) {
      if (offset >= sizes[file]) {
        ++file;
        offset = 0;
        continue;
      }
      const uint64_t len = std::min(options.chunk, sizes[file] - offset);
      const size_t slot = free_slots.back();
      free_slots.pop_back();
      batch.push_back({static_cast<uint32_t>(file), offset, len,
                       scratch.get() + slot * options.chunk, slot});
      offset += len;
      result.bytes += len;
    }
    if (!batch.empty()) reader->Submit(batch);
    if (reader->pending() == 0 && file >= sizes.size()) break;
    pollfd pfd{reader->completion_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 100);
    done.clear();
    reader->Reap(&done);
    for (io::ReadCompletion& c : done) {
      LOADSTONE_RETURN_IF_ERROR(c.status);
      free_slots.push_back(c.tag);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace loadstone
