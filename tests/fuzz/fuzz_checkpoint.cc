// A whole checkpoint file as Checkpoint::Open sees it — the first byte picks the format (by the
// file's name: safetensors, a PyTorch .bin zip, GGUF), the rest is the file — then, when it
// opens, planned and loaded into bf16 (quantized weights dequantized with whatever quant state
// the file holds): every catalog (safetensors header, zip directory, unpickler, GGUF,
// bitsandbytes / compressed-tensors / GPTQ states) and every decoder meets the input.
#include "fuzz_input.h"
#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  if (size == 0) return 0;
  static const char* const kNames[] = {"model.safetensors", "pytorch_model.bin", "model.gguf"};
  const std::string path = fuzz::WriteInput(data + 1, size - 1, kNames[data[0] % 3]);
  auto ckpt = Checkpoint::Open(path);
  fuzz::CheckRefusal(ckpt.status());
  if (!ckpt.ok()) return 0;
  PlanOptions options;
  options.dtype = DType::kBF16;
  options.device_map = "cpu";
  auto plan = Plan(*ckpt, options);
  fuzz::CheckRefusal(plan.status());
  if (!plan.ok() || plan->placed_bytes > (64u << 20)) return 0;  // bounded work per input
  static Loader loader;
  LoadHandle load = loader.Load(*ckpt, *plan);
  fuzz::CheckRefusal(load.Done().get());
  return 0;
}
