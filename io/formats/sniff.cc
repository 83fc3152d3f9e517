#include "io/formats/sniff.h"

#include <cstring>
#include <string_view>

namespace loadstone::io {

std::string ForeignFormat(std::span<const std::byte> head) {
  auto starts = [&](std::string_view magic) {
    return head.size() >= magic.size() && std::memcmp(head.data(), magic.data(), magic.size()) == 0;
  };
  if (starts("GGUF")) {
    return "it is a GGUF file (it starts with \"GGUF\"), not safetensors; name it .gguf and "
           "loadstone reads it as one";
  }
  if (starts("PK\x03\x04") || starts("PK\x05\x06")) {
    return "it is a zip archive (as torch.save writes a PyTorch checkpoint), not safetensors; "
           "name it .bin (or .pt) and loadstone reads it as one";
  }
  if (head.size() >= 2 && head[0] == std::byte{0x80} && static_cast<int>(head[1]) <= 5) {
    return "it is a Python pickle (a legacy, pre-1.6 torch.save checkpoint?), not safetensors; "
           "loadstone does not read those: re-save it with a current PyTorch";
  }
  if (starts("\x89HDF")) return "it is an HDF5 file (a Keras .h5 model?), not safetensors";
  return "";
}

}  // namespace loadstone::io
