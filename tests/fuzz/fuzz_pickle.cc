// The restricted unpickler on any opcode stream: it must refuse, never build what the stream
// asks for (no global other than the few a state dict uses is ever resolved).
#include "fuzz_input.h"
#include "io/formats/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dict = loadstone::io::ParseTorchPickle(loadstone::fuzz::AsText(data, size), "fuzz");
  loadstone::fuzz::CheckRefusal(dict.status());
  return 0;
}
