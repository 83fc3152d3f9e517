// What a file is by its first bytes, for errors about files that are not what their name says.
#ifndef LOADSTONE_IO_FORMATS_SNIFF_H_
#define LOADSTONE_IO_FORMATS_SNIFF_H_

#include <cstddef>
#include <span>
#include <string>

namespace loadstone::io {

// For the first bytes of a file (8 are enough): a sentence naming a format loadstone recognises
// but that is not safetensors ("a GGUF file (it starts with \"GGUF\")", "a zip archive, as
// torch.save writes ..."), or empty when the bytes mean nothing in particular.
std::string ForeignFormat(std::span<const std::byte> head);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_SNIFF_H_
