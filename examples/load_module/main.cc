// load_module CHECKPOINT: builds a small torch::nn::Module (three blocks and a head, the model
// of tests/fixtures/offload/) and fills it from CHECKPOINT with loadstone::libtorch::LoadInto —
// a .bin or a safetensors file, as diffusers' from_pretrained would — then prints the report.
#include <iostream>

#include <loadstone/torch.h>

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t rows, int64_t cols, bool bias, bool scale, bool ids, bool mask) {
    w = register_parameter("w", torch::zeros({rows, cols}));
    if (bias) register_parameter("b", torch::zeros({rows}));
    if (scale) register_parameter("scale", torch::zeros({}));
    if (ids) register_buffer("ids", torch::zeros({4}, torch::kLong));
    if (mask) register_buffer("mask", torch::zeros({5}, torch::kBool));
  }
  torch::Tensor w;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module, loadstone::libtorch::ModelTraits {
  ModelImpl() {
    blocks = register_module("blocks", torch::nn::ModuleList(Block(64, 64, true, false, false, false),
                                                             Block(64, 64, false, true, true, false),
                                                             Block(32, 32, false, false, false, true)));
    head = register_module("head", Block(16, 64, true, false, false, false));
  }
  std::optional<std::vector<std::string>> no_split_modules() const override {
    return std::vector<std::string>{"Block"};
  }
  torch::nn::ModuleList blocks{nullptr};
  Block head{nullptr};
};
TORCH_MODULE(Model);

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: load_module CHECKPOINT\n";
    return 2;
  }
  Model model;
  loadstone::libtorch::TorchLoadOptions options;
  options.dtype = at::kFloat;  // torch_dtype: the fixture's bf16 and f16 weights become float32
  auto report = loadstone::libtorch::LoadInto(*model, argv[1], options);
  if (!report.ok()) {
    std::cerr << "error: " << report.status() << "\n";
    return 1;
  }
  std::cout << "loaded " << report->placement.device_of.size() << " tensors into the module; "
            << report->missing_keys.size() << " missing, " << report->unexpected_keys.size()
            << " unexpected; device map " << report->placement.device_map.ToJson() << "\n";
  std::cout << "blocks.1.scale = " << model->blocks[1]->named_parameters()["scale"].item<float>()
            << ", head.w[0][0] = " << model->head->w[0][0].item<float>() << "\n";
  return report->missing_keys.empty() && report->unexpected_keys.empty() ? 0 : 1;
}
