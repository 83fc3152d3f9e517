// A Llama decoder in plain LibTorch, its modules named as transformers' LlamaForCausalLM names
// them (model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head), so that
// loadstone::libtorch::LoadInto fills it from a Hugging Face checkpoint. Rotary embeddings
// (rope_type "default"), grouped-query attention, RMSNorm and a SiLU-gated MLP, as transformers
// computes them. Used by forward_while_loading.cc and its test.
#ifndef LOADSTONE_EXAMPLES_FORWARD_WHILE_LOADING_LLAMA_H_
#define LOADSTONE_EXAMPLES_FORWARD_WHILE_LOADING_LLAMA_H_

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace llama {

struct Config {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t head_dim = 0;
  double eps = 1e-6, rope_theta = 10000.0;

  // From a transformers config.json (model_type "llama").
  static Config Read(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    const nlohmann::json j = nlohmann::json::parse(in);
    Config c;
    c.vocab = j.at("vocab_size");
    c.hidden = j.at("hidden_size");
    c.intermediate = j.at("intermediate_size");
    c.layers = j.at("num_hidden_layers");
    c.heads = j.at("num_attention_heads");
    c.kv_heads = j.value("num_key_value_heads", c.heads);
    c.head_dim = j.value("head_dim", c.hidden / c.heads);
    c.eps = j.value("rms_norm_eps", 1e-6);
    if (j.contains("rope_parameters")) c.rope_theta = j["rope_parameters"].value("rope_theta", 1e4);
    if (j.contains("rope_theta")) c.rope_theta = j["rope_theta"];
    return c;
  }
};

struct RmsNormImpl : torch::nn::Module {
  RmsNormImpl(int64_t size, double epsilon) : eps(epsilon) {
    weight = register_parameter("weight", torch::ones({size}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor f = x.to(torch::kFloat);
    const torch::Tensor normed = f * torch::rsqrt(f.pow(2).mean(-1, true) + eps);
    return weight * normed.to(x.scalar_type());
  }
  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(RmsNorm);

inline torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Config& config) : c(config) {
    auto linear = [](int64_t in, int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    q_proj = register_module("q_proj", linear(c.hidden, c.heads * c.head_dim));
    k_proj = register_module("k_proj", linear(c.hidden, c.kv_heads * c.head_dim));
    v_proj = register_module("v_proj", linear(c.hidden, c.kv_heads * c.head_dim));
    o_proj = register_module("o_proj", linear(c.heads * c.head_dim, c.hidden));
  }
  // x: [batch, seq, hidden]; cos, sin: [seq, head_dim].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const int64_t b = x.size(0), s = x.size(1);
    auto heads = [&](const torch::Tensor& t, int64_t n) {
      return t.view({b, s, n, c.head_dim}).transpose(1, 2);
    };
    torch::Tensor q = heads(q_proj(x), c.heads), k = heads(k_proj(x), c.kv_heads);
    const torch::Tensor v = heads(v_proj(x), c.kv_heads).repeat_interleave(c.heads / c.kv_heads, 1);
    const torch::Tensor cs = cos.to(q.scalar_type()), sn = sin.to(q.scalar_type());
    q = q * cs + RotateHalf(q) * sn;
    k = (k * cs + RotateHalf(k) * sn).repeat_interleave(c.heads / c.kv_heads, 1);
    torch::Tensor scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(double(c.head_dim));
    const torch::Tensor causal = torch::ones({s, s}, torch::kBool).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    const torch::Tensor probs = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());
    const torch::Tensor out = torch::matmul(probs, v).transpose(1, 2).reshape({b, s, -1});
    return o_proj(out);
  }
  Config c;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const Config& c) {
    auto linear = [](int64_t in, int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    gate_proj = register_module("gate_proj", linear(c.hidden, c.intermediate));
    up_proj = register_module("up_proj", linear(c.hidden, c.intermediate));
    down_proj = register_module("down_proj", linear(c.intermediate, c.hidden));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
  }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const Config& c) {
    input_layernorm = register_module("input_layernorm", RmsNorm(c.hidden, c.eps));
    self_attn = register_module("self_attn", Attention(c));
    post_attention_layernorm =
        register_module("post_attention_layernorm", RmsNorm(c.hidden, c.eps));
    mlp = register_module("mlp", Mlp(c));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
    return h + mlp(post_attention_layernorm(h));
  }
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const Config& c) {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.hidden));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) layers->push_back(DecoderLayer(c));
    norm = register_module("norm", RmsNorm(c.hidden, c.eps));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Model);

// LlamaForCausalLM, run one step at a time: Embed, each Layer, then Head; Forward runs them all.
struct ForCausalLMImpl : torch::nn::Module {
  explicit ForCausalLMImpl(const Config& config) : c(config) {
    model = register_module("model", Model(c));
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden, c.vocab).bias(false)));
  }
  // ids: [batch, seq] (int64) → hidden states; sets the rotary tables for seq positions.
  torch::Tensor Embed(const torch::Tensor& ids) {
    const int64_t s = ids.size(1);
    const torch::Tensor inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, c.head_dim, 2,
                                                                           torch::kFloat) /
                                                                   double(c.head_dim));
    const torch::Tensor freqs = torch::outer(torch::arange(s, torch::kFloat), inv);
    const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
    cos = emb.cos();
    sin = emb.sin();
    return model->embed_tokens(ids);
  }
  torch::Tensor Layer(int64_t k, const torch::Tensor& x) {
    return model->layers[k]->as<DecoderLayer>()->forward(x, cos, sin);
  }
  torch::Tensor Head(const torch::Tensor& x) { return lm_head(model->norm(x)); }
  torch::Tensor Forward(const torch::Tensor& ids) {
    torch::Tensor x = Embed(ids);
    for (int64_t k = 0; k < c.layers; ++k) x = Layer(k, x);
    return Head(x);
  }
  Config c;
  Model model{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::Tensor cos, sin;
};
TORCH_MODULE(ForCausalLM);

}  // namespace llama

#endif  // LOADSTONE_EXAMPLES_FORWARD_WHILE_LOADING_LLAMA_H_
