// A bitsandbytes 4-bit quant state (io/formats/bnb_state.h): the JSON transformers saves as the
// `W.quant_state.bitsandbytes__nf4|fp4` tensor, among well-formed companions (the packed weight,
// its absmax, bitsandbytes' quant_map, and when byte 0 says so the nested tables), opened and,
// when the state is accepted, loaded into bf16 — every decode path the JSON can choose.
//   byte 0: bit 0: fp4 (else nf4); bit 1: nested companions; the rest: the JSON.
#include <cstring>
#include <vector>

#include "fuzz_input.h"
#include "io/formats/bnb_state.h"
#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"

namespace {

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loadstone;
  if (size == 0) return 0;
  const bool fp4 = data[0] & 1;
  const bool nested = data[0] & 2;
  // 256 elements [16, 16] in 64-blocks: 128 packed bytes, 4 absmax values.
  static const std::vector<std::byte> weight = [] {
    std::vector<std::byte> w(128);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::byte>(i * 37 + 11);
    return w;
  }();
  std::vector<float> code(16);
  if (fp4) {
    for (int i = 0; i < 8; ++i) code[i] = io::Fp4Magnitudes()[i], code[8 + i] = -code[i];
  } else {
    for (int i = 0; i < 16; ++i) code[i] = io::Nf4Code()[i];
  }
  const std::string w = "model.layers.0.mlp.up_proj.weight";
  std::vector<std::byte> state(reinterpret_cast<const std::byte*>(data + 1),
                               reinterpret_cast<const std::byte*>(data + size));
  const auto quant_map = Bytes(code);
  const auto absmax_f32 = Bytes(std::vector<float>{0.5f, 1.0f, 2.0f, 0.25f});
  const std::vector<std::byte> absmax_u8 = {std::byte{3}, std::byte{200}, std::byte{128},
                                            std::byte{0}};
  std::vector<float> nested_code(256);
  for (int i = 0; i < 256; ++i) nested_code[i] = (i - 128) / 128.0f;
  const auto nested_map = Bytes(nested_code);
  const auto nested_absmax = Bytes(std::vector<float>{0.75f});
  std::vector<TensorToWrite> tensors = {
      {w, DType::kU8, {128, 1}, weight, {}},
      {w + ".quant_map", DType::kF32, {16}, quant_map, {}},
      {w + ".quant_state.bitsandbytes__" + (fp4 ? "fp4" : "nf4"),
       DType::kU8,
       {state.size()},
       state,
       {}},
  };
  if (nested) {
    tensors.push_back({w + ".absmax", DType::kU8, {4}, absmax_u8, {}});
    tensors.push_back({w + ".nested_quant_map", DType::kF32, {256}, nested_map, {}});
    tensors.push_back({w + ".nested_absmax", DType::kF32, {1}, nested_absmax, {}});
  } else {
    tensors.push_back({w + ".absmax", DType::kF32, {4}, absmax_f32, {}});
  }
  const std::string path = fuzz::WriteInput(data, 0, "model.safetensors");
  if (!WriteSafetensors(path, tensors).ok()) return 0;
  auto ckpt = Checkpoint::Open(path);
  fuzz::CheckRefusal(ckpt.status());
  if (!ckpt.ok()) return 0;
  PlanOptions options;
  options.dtype = DType::kBF16;
  auto plan = Plan(*ckpt, options);
  fuzz::CheckRefusal(plan.status());
  if (!plan.ok()) return 0;
  static Loader loader;
  fuzz::CheckRefusal(loader.Load(*ckpt, *plan).Done().get());
  return 0;
}
