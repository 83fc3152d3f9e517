// A GGUF header (io/formats/gguf.h) on any bytes, with its promise as the oracle: every tensor it
// catalogs lies inside the file's data section, and a file it accepts is no larger than the input.
#include <cstdio>
#include <cstdlib>

#include "fuzz_input.h"
#include "io/formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  const io::File file = fuzz::InputFile(data, size, "model.gguf");
  auto gguf = io::ReadGgufHeader(file);
  fuzz::CheckRefusal(gguf.status());
  if (!gguf.ok()) return 0;
  for (const TensorInfo& t : gguf->tensors) {
    if (t.offset < gguf->data_start || t.offset > size || t.nbytes > size - t.offset) {
      std::fprintf(stderr, "gguf tensor '%s' at %llu+%llu lies outside the %zu-byte file\n",
                   t.name.c_str(), static_cast<unsigned long long>(t.offset),
                   static_cast<unsigned long long>(t.nbytes), size);
      std::abort();
    }
  }
  return 0;
}
