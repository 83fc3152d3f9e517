// A model folder as Checkpoint::Open resolves it (io/formats/hf_layout.h): which of the Hugging
// Face names it holds, with --variant and --subfolder, the shard index, every shard's header,
// config.json and the quantization catalogs. The input is a list of files:
//   byte 0: the open options (bit 0: variant "fp16", bit 1: subfolder "unet");
//   then, per file: one byte picking its name from kNames, two bytes of length (little-endian),
//   that many bytes of content (fewer when the input ends first).
// The names are Hugging Face's (and near misses), so the fuzzer spends its time on contents and
// combinations, not on spelling.
#include <filesystem>
#include <fstream>

#include "fuzz_input.h"
#include "loadstone/checkpoint.h"

namespace {

constexpr const char* kNames[] = {
    "model.safetensors",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.fp16.safetensors",
    "model.safetensors.index.fp16.json",
    "model.fp16.safetensors.index.json",
    "model-00001-of-00002.fp16.safetensors",
    "model.fp16-00001-of-00002.safetensors",
    "model.fp16-00002-of-00002.safetensors",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
    "pytorch_model.bin",
    "pytorch_model.fp16.bin",
    "pytorch_model.bin.index.json",
    "pytorch_model-00001-of-00002.bin",
    "pytorch_model-00002-of-00002.bin",
    "pytorch_model-00001-of-00003.bin",
    "pytorch_model-00002-of-00003.bin",
    "pytorch_model-00003-of-00003.bin",
    "diffusion_pytorch_model.bin",
    "diffusion_pytorch_model.fp16.safetensors",
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model-00001-of-00002.safetensors",
    "config.json",
    "quantize_config.json",
    "model.gguf",
    "model-00001-of-00002.gguf",
    "model-00002-of-00002.gguf",
    "model-00001-of-00003.gguf",
    "model-00002-of-00003.gguf",
    "model-00003-of-00003.gguf",
    "index.json",
    "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors",
    "unet/config.json",
    "unet/diffusion_pytorch_model.safetensors.index.json",
    "unet/diffusion_pytorch_model-00001-of-00002.safetensors",
    "adapter_model.safetensors",
    "model_index.json",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  namespace fs = std::filesystem;
  if (size == 0) return 0;
  const fs::path folder = fs::path(fuzz::InputFolder(fuzz::WriteInput(data, 0, "input"))) / "model";
  fs::remove_all(folder);
  fs::create_directories(folder / "unet");
  OpenOptions options;
  if (data[0] & 1) options.variant = "fp16";
  if (data[0] & 2) options.subfolder = "unet";
  size_t at = 1;
  while (at + 3 <= size) {
    const char* name = kNames[data[at] % std::size(kNames)];
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    std::ofstream(folder / name, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(data + at + 3), static_cast<std::streamsize>(length));
    at += 3 + length;
  }
  fuzz::CheckRefusal(Checkpoint::Open(folder.string(), options).status());
  return 0;
}
