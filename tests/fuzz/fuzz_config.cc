// The JSON documents beside the weights: the first byte picks config.json (ModelConfig, its
// quantization_config), AutoGPTQ's quantize_config.json, or a shard index.
#include "fuzz_input.h"
#include "io/formats/hf_config.h"
#include "io/formats/hf_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      fuzz::CheckRefusal(
          io::ReadModelConfig(fuzz::WriteInput(data + 1, size - 1, "config.json")).status());
      break;
    case 1: {
      ModelConfig config;
      fuzz::CheckRefusal(io::ReadQuantizeConfig(
          fuzz::WriteInput(data + 1, size - 1, "quantize_config.json"), &config));
      break;
    }
    default:
      fuzz::CheckRefusal(
          io::ReadShardIndex(fuzz::WriteInput(data + 1, size - 1, "model.safetensors.index.json"))
              .status());
  }
  return 0;
}
