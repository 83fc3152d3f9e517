// The zip directory of a PyTorch .bin (io/formats/zip.h) on any bytes, with its promises as the
// oracle: every entry it hands back lies inside the file, its data after its local header, apart
// from every other entry's, and findable by its name.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "fuzz_input.h"
#include "io/formats/zip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  const io::File file = fuzz::InputFile(data, size, "archive.pt");
  auto zip = io::ReadZipArchive(file);
  fuzz::CheckRefusal(zip.status());
  if (!zip.ok()) return 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const io::ZipEntry& e : zip->entries) {
    const bool inside = e.data_offset <= size && e.stored_size <= size - e.data_offset &&
                        e.local_offset < e.data_offset;
    if (!inside || zip->Find(e.name) != &e) {
      std::fprintf(stderr, "zip entry '%s' broken: data %llu+%llu, local %llu, file %zu\n",
                   e.name.c_str(), static_cast<unsigned long long>(e.data_offset),
                   static_cast<unsigned long long>(e.stored_size),
                   static_cast<unsigned long long>(e.local_offset), size);
      std::abort();
    }
    if (e.stored_size > 0) spans.emplace_back(e.data_offset, e.data_offset + e.stored_size);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      std::fprintf(stderr, "zip entries overlap at byte %llu\n",
                   static_cast<unsigned long long>(spans[i].first));
      std::abort();
    }
  }
  return 0;
}
