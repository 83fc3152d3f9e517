// The safetensors header parser on any text: the header of a file a little larger than it.
#include "fuzz_input.h"
#include "io/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto header = loadstone::io::ParseSafetensorsHeader(loadstone::fuzz::AsText(data, size),
                                                           8 + size + 4096, "fuzz.safetensors");
  loadstone::fuzz::CheckRefusal(header.status());
  return 0;
}
