// forward_while_loading MODEL: a Hugging Face Llama folder (config.json and safetensors) loaded
// into a LibTorch Llama (llama.h) with loadstone::libtorch::StartLoadInto, whose forward pass
// runs layer by layer as each layer lands — the embeddings and the first layers come first
// (loadstone reads in the order the model runs), so compute starts long before the last byte.
// Then the same model loaded whole (LoadInto) runs its forward pass: the logits are compared.
#include <chrono>
#include <iostream>

#include <loadstone/torch.h>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: forward_while_loading MODEL_FOLDER\n";
    return 2;
  }
  const std::string path = argv[1];
  const llama::Config config = llama::Config::Read(path + "/config.json");
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{1, 2, 3}}, torch::kLong);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto ms = [&] {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };

  llama::ForCausalLM streamed(config);
  auto load = loadstone::libtorch::StartLoadInto(*streamed, path);
  if (!load.ok()) {
    std::cerr << "error: " << load.status() << "\n";
    return 1;
  }
  loadstone::libtorch::ModuleLoad& l = **load;
  auto wait = [&](const std::string& module) {
    const loadstone::Status s = l.Module(module).get();
    if (!s.ok()) {
      std::cerr << "error: " << s << "\n";
      std::exit(1);
    }
    const loadstone::Progress p = l.handle().progress();
    std::cout << module << " ready at " << ms() << " ms (" << p.tensors_done << " of "
              << p.tensors_total << " tensors loaded)\n";
  };
  wait("model.embed_tokens");
  torch::Tensor x = streamed->Embed(ids);
  for (int64_t k = 0; k < config.layers; ++k) {
    wait("model.layers." + std::to_string(k));
    x = streamed->Layer(k, x);
  }
  wait("model.norm");
  wait("lm_head");
  const torch::Tensor logits = streamed->Head(x);
  if (auto report = l.Finish(); !report.ok()) {
    std::cerr << "error: " << report.status() << "\n";
    return 1;
  }
  std::cout << "logits out at " << ms() << " ms; next token "
            << logits[0][-1].argmax().item<int64_t>() << "\n";

  llama::ForCausalLM whole(config);
  if (auto report = loadstone::libtorch::LoadInto(*whole, path); !report.ok()) {
    std::cerr << "error: " << report.status() << "\n";
    return 1;
  }
  const bool same = torch::equal(whole->Forward(ids), logits);
  std::cout << (same ? "identical to the forward pass after a whole load\n"
                     : "DIFFERENT from the forward pass after a whole load\n");
  return same ? 0 : 1;
}
