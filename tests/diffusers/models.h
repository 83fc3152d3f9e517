// Small LibTorch models shaped like diffusers' test models — module names, classes and
// no-split declarations as diffusers has them — each with a deterministic forward pass:
//   UNet2DConditionModel  (ResnetBlock2D, Transformer2DModel/BasicTransformerBlock,
//                          CrossAttnDownBlock2D, UNetMidBlock2DCrossAttn, CrossAttnUpBlock2D)
//   AutoencoderKL         (Encoder/Decoder of ResnetBlock2D, a mid-block Attention)
//   DiTTransformer2DModel (PatchEmbed with an int64 buffer and a non-persistent one,
//                          BasicTransformerBlocks, proj_out)
// Sizes are tiny (a few hundred KiB) so that the suite runs in seconds.
#ifndef LOADSTONE_TESTS_DIFFUSERS_MODELS_H_
#define LOADSTONE_TESTS_DIFFUSERS_MODELS_H_

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "loadstone/torch.h"

namespace loadstone::testing::diffusers {

namespace nn = torch::nn;

inline nn::Conv2d Conv(int64_t in, int64_t out, int64_t k = 3, int64_t stride = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2));
}
inline nn::GroupNorm GN(int64_t channels) { return nn::GroupNorm(nn::GroupNormOptions(8, channels)); }

struct AttentionImpl : nn::Module {
  AttentionImpl(int64_t dim, int64_t context_dim, int64_t num_heads = 2) : heads(num_heads) {
    to_q = register_module("to_q", nn::Linear(nn::LinearOptions(dim, dim).bias(false)));
    to_k = register_module("to_k", nn::Linear(nn::LinearOptions(context_dim, dim).bias(false)));
    to_v = register_module("to_v", nn::Linear(nn::LinearOptions(context_dim, dim).bias(false)));
    to_out = register_module("to_out", nn::ModuleList(nn::Linear(dim, dim)));
  }
  // x: [B, N, dim], context: [B, M, context_dim] (x itself for self-attention).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context) {
    const int64_t b = x.size(0), n = x.size(1), d = x.size(2), h = heads;
    auto split = [&](const torch::Tensor& t) { return t.view({b, -1, h, d / h}).transpose(1, 2); };
    auto q = split(to_q(x)), k = split(to_k(context)), v = split(to_v(context));
    auto w = torch::softmax(torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(d / h)), -1);
    auto o = torch::matmul(w, v).transpose(1, 2).reshape({b, n, d});
    return to_out[0]->as<nn::Linear>()->forward(o);
  }
  int64_t heads;
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  nn::ModuleList to_out{nullptr};
};
TORCH_MODULE(Attention);

struct FeedForwardImpl : nn::Module {
  explicit FeedForwardImpl(int64_t dim) {
    net = register_module("net", nn::ModuleList(nn::Linear(dim, 4 * dim), nn::Linear(4 * dim, dim)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return net[1]->as<nn::Linear>()->forward(torch::gelu(net[0]->as<nn::Linear>()->forward(x)));
  }
  nn::ModuleList net{nullptr};
};
TORCH_MODULE(FeedForward);

struct BasicTransformerBlockImpl : nn::Module {
  BasicTransformerBlockImpl(int64_t dim, int64_t context_dim) {
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({dim})));
    attn1 = register_module("attn1", Attention(dim, dim));
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim})));
    attn2 = register_module("attn2", Attention(dim, context_dim));
    norm3 = register_module("norm3", nn::LayerNorm(nn::LayerNormOptions({dim})));
    ff = register_module("ff", FeedForward(dim));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& context) {
    auto n = norm1(x);
    x = x + attn1(n, n);
    x = x + attn2(norm2(x), context);
    return x + ff(norm3(x));
  }
  nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  Attention attn1{nullptr}, attn2{nullptr};
  FeedForward ff{nullptr};
};
TORCH_MODULE(BasicTransformerBlock);

struct ResnetBlock2DImpl : nn::Module {
  ResnetBlock2DImpl(int64_t in, int64_t out, int64_t temb) {
    norm1 = register_module("norm1", GN(in));
    conv1 = register_module("conv1", Conv(in, out));
    if (temb > 0) time_emb_proj = register_module("time_emb_proj", nn::Linear(temb, out));
    norm2 = register_module("norm2", GN(out));
    conv2 = register_module("conv2", Conv(out, out));
    if (in != out) conv_shortcut = register_module("conv_shortcut", Conv(in, out, 1));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    auto h = conv1(torch::silu(norm1(x)));
    if (time_emb_proj) h = h + time_emb_proj(torch::silu(temb)).unsqueeze(-1).unsqueeze(-1);
    h = conv2(torch::silu(norm2(h)));
    return (conv_shortcut ? conv_shortcut(x) : x) + h;
  }
  nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
  nn::Linear time_emb_proj{nullptr};
};
TORCH_MODULE(ResnetBlock2D);

// diffusers' Transformer2DModel as used inside UNet blocks: image tokens through blocks.
struct Transformer2DModelImpl : nn::Module {
  Transformer2DModelImpl(int64_t ch, int64_t context_dim) {
    norm = register_module("norm", GN(ch));
    proj_in = register_module("proj_in", nn::Linear(ch, ch));
    transformer_blocks =
        register_module("transformer_blocks", nn::ModuleList(BasicTransformerBlock(ch, context_dim)));
    proj_out = register_module("proj_out", nn::Linear(ch, ch));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    auto t = proj_in(norm(x).permute({0, 2, 3, 1}).reshape({b, h * w, c}));
    for (const auto& block : *transformer_blocks) t = block->as<BasicTransformerBlock>()->forward(t, context);
    return x + proj_out(t).reshape({b, h, w, c}).permute({0, 3, 1, 2});
  }
  nn::GroupNorm norm{nullptr};
  nn::Linear proj_in{nullptr}, proj_out{nullptr};
  nn::ModuleList transformer_blocks{nullptr};
};
TORCH_MODULE(Transformer2DModel);

struct Downsample2DImpl : nn::Module {
  explicit Downsample2DImpl(int64_t ch) { conv = register_module("conv", Conv(ch, ch, 3, 2)); }
  torch::Tensor forward(const torch::Tensor& x) { return conv(x); }
  nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

struct Upsample2DImpl : nn::Module {
  explicit Upsample2DImpl(int64_t ch) { conv = register_module("conv", Conv(ch, ch)); }
  torch::Tensor forward(const torch::Tensor& x) {
    return conv(torch::nn::functional::interpolate(
        x, torch::nn::functional::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest)));
  }
  nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

// A cross-attention block: resnet + transformer, then a down- or upsampler when asked.
template <typename Sampler>
struct CrossAttnBlock : nn::Module {
  CrossAttnBlock(int64_t in, int64_t out, int64_t temb, int64_t context_dim, bool sample,
                 const char* sampler_name) {
    resnets = register_module("resnets", nn::ModuleList(ResnetBlock2D(in, out, temb)));
    attentions = register_module("attentions", nn::ModuleList(Transformer2DModel(out, context_dim)));
    if (sample) samplers = register_module(sampler_name, nn::ModuleList(Sampler(out)));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& temb, const torch::Tensor& context) {
    x = resnets[0]->as<ResnetBlock2D>()->forward(x, temb);
    x = attentions[0]->as<Transformer2DModel>()->forward(x, context);
    if (samplers) x = samplers[0]->as<Sampler>()->forward(x);
    return x;
  }
  nn::ModuleList resnets{nullptr}, attentions{nullptr}, samplers{nullptr};
};

struct CrossAttnDownBlock2DImpl : CrossAttnBlock<Downsample2D> {
  CrossAttnDownBlock2DImpl(int64_t in, int64_t out, int64_t temb, int64_t ctx, bool down)
      : CrossAttnBlock(in, out, temb, ctx, down, "downsamplers") {}
};
TORCH_MODULE(CrossAttnDownBlock2D);

struct CrossAttnUpBlock2DImpl : CrossAttnBlock<Upsample2D> {
  CrossAttnUpBlock2DImpl(int64_t in, int64_t out, int64_t temb, int64_t ctx, bool up)
      : CrossAttnBlock(in, out, temb, ctx, up, "upsamplers") {}
};
TORCH_MODULE(CrossAttnUpBlock2D);

struct UNetMidBlock2DCrossAttnImpl : nn::Module {
  UNetMidBlock2DCrossAttnImpl(int64_t ch, int64_t temb, int64_t ctx) {
    resnets = register_module("resnets", nn::ModuleList(ResnetBlock2D(ch, ch, temb), ResnetBlock2D(ch, ch, temb)));
    attentions = register_module("attentions", nn::ModuleList(Transformer2DModel(ch, ctx)));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& temb, const torch::Tensor& ctx) {
    x = resnets[0]->as<ResnetBlock2D>()->forward(x, temb);
    x = attentions[0]->as<Transformer2DModel>()->forward(x, ctx);
    return resnets[1]->as<ResnetBlock2D>()->forward(x, temb);
  }
  nn::ModuleList resnets{nullptr}, attentions{nullptr};
};
TORCH_MODULE(UNetMidBlock2DCrossAttn);

struct TimestepEmbeddingImpl : nn::Module {
  TimestepEmbeddingImpl(int64_t in, int64_t out) {
    linear_1 = register_module("linear_1", nn::Linear(in, out));
    linear_2 = register_module("linear_2", nn::Linear(out, out));
  }
  torch::Tensor forward(const torch::Tensor& x) { return linear_2(torch::silu(linear_1(x))); }
  nn::Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(TimestepEmbedding);

// Sinusoidal timestep features (no parameters), as diffusers' Timesteps.
inline torch::Tensor TimestepFeatures(const torch::Tensor& t, int64_t dim) {
  auto half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) * torch::arange(half, torch::kFloat) / half);
  auto args = t.to(torch::kFloat).unsqueeze(-1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, -1);
}

struct Inputs {
  std::vector<torch::Tensor> tensors;
};

// ---- UNet2DConditionModel -------------------------------------------------------------------

struct UNet2DConditionModelImpl : nn::Module, libtorch::ModelTraits {
  static constexpr int64_t kCtx = 16, kTemb = 64;
  UNet2DConditionModelImpl() {
    conv_in = register_module("conv_in", Conv(4, 32));
    time_embedding = register_module("time_embedding", TimestepEmbedding(32, kTemb));
    down_blocks = register_module("down_blocks", nn::ModuleList(CrossAttnDownBlock2D(32, 32, kTemb, kCtx, true),
                                                                CrossAttnDownBlock2D(32, 64, kTemb, kCtx, false)));
    mid_block = register_module("mid_block", UNetMidBlock2DCrossAttn(64, kTemb, kCtx));
    up_blocks = register_module("up_blocks", nn::ModuleList(CrossAttnUpBlock2D(64, 64, kTemb, kCtx, true),
                                                            CrossAttnUpBlock2D(64, 32, kTemb, kCtx, false)));
    conv_norm_out = register_module("conv_norm_out", GN(32));
    conv_out = register_module("conv_out", Conv(32, 4));
  }
  std::optional<std::vector<std::string>> no_split_modules() const override {
    return std::vector<std::string>{"BasicTransformerBlock", "ResnetBlock2D", "CrossAttnUpBlock2D"};
  }
  torch::Tensor forward(const Inputs& in) {
    const auto& sample = in.tensors[0];
    const auto& ctx = in.tensors[2];
    auto temb = time_embedding(TimestepFeatures(in.tensors[1], 32));
    auto x = conv_in(sample);
    for (const auto& b : *down_blocks) x = b->as<CrossAttnDownBlock2D>()->forward(x, temb, ctx);
    x = mid_block(x, temb, ctx);
    for (const auto& b : *up_blocks) x = b->as<CrossAttnUpBlock2D>()->forward(x, temb, ctx);
    return conv_out(torch::silu(conv_norm_out(x)));
  }
  static Inputs MakeInputs() {
    torch::manual_seed(0);
    return {{torch::randn({2, 4, 8, 8}), torch::tensor({10, 500}), torch::randn({2, 4, kCtx})}};
  }
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  TimestepEmbedding time_embedding{nullptr};
  nn::ModuleList down_blocks{nullptr}, up_blocks{nullptr};
  UNetMidBlock2DCrossAttn mid_block{nullptr};
  nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(UNet2DConditionModel);

// ---- AutoencoderKL ----------------------------------------------------------------------------

struct VaeMidBlockImpl : nn::Module {
  explicit VaeMidBlockImpl(int64_t ch) {
    resnets = register_module("resnets", nn::ModuleList(ResnetBlock2D(ch, ch, 0), ResnetBlock2D(ch, ch, 0)));
    group_norm = register_module("group_norm", GN(ch));
    attentions = register_module("attentions", nn::ModuleList(Attention(ch, ch, 1)));
  }
  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor none;
    x = resnets[0]->as<ResnetBlock2D>()->forward(x, none);
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    auto t = group_norm(x).permute({0, 2, 3, 1}).reshape({b, h * w, c});
    t = attentions[0]->as<Attention>()->forward(t, t);
    x = x + t.reshape({b, h, w, c}).permute({0, 3, 1, 2});
    return resnets[1]->as<ResnetBlock2D>()->forward(x, none);
  }
  nn::ModuleList resnets{nullptr}, attentions{nullptr};
  nn::GroupNorm group_norm{nullptr};
};
TORCH_MODULE(VaeMidBlock);

struct CoderImpl : nn::Module {
  CoderImpl(int64_t in, int64_t out, bool is_encoder) : down(is_encoder) {
    conv_in = register_module("conv_in", Conv(in, 32));
    // down_blocks.0.resnets.0 / up_blocks.0.resnets.0 and its sampler, as diffusers names them.
    blocks = register_module(down ? "down_blocks" : "up_blocks", nn::ModuleList());
    resnets = nn::ModuleList(ResnetBlock2D(32, 32, 0));
    sampler = down ? nn::ModuleList(Downsample2D(32)) : nn::ModuleList(Upsample2D(32));
    auto holder = std::make_shared<nn::Module>(down ? "DownEncoderBlock2D" : "UpDecoderBlock2D");
    holder->register_module("resnets", resnets);
    holder->register_module(down ? "downsamplers" : "upsamplers", sampler);
    blocks->push_back(holder);
    mid_block = register_module("mid_block", VaeMidBlock(32));
    conv_norm_out = register_module("conv_norm_out", GN(32));
    conv_out = register_module("conv_out", Conv(32, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor none;
    x = conv_in(x);
    auto run_block = [&] {
      x = resnets[0]->as<ResnetBlock2D>()->forward(x, none);
      x = down ? sampler[0]->as<Downsample2D>()->forward(x) : sampler[0]->as<Upsample2D>()->forward(x);
    };
    if (down) run_block();
    x = mid_block(x);
    if (!down) run_block();
    return conv_out(torch::silu(conv_norm_out(x)));
  }
  bool down;
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  nn::ModuleList blocks{nullptr}, resnets{nullptr}, sampler{nullptr};
  VaeMidBlock mid_block{nullptr};
  nn::GroupNorm conv_norm_out{nullptr};
};
TORCH_MODULE(Coder);

struct AutoencoderKLImpl : nn::Module, libtorch::ModelTraits {
  AutoencoderKLImpl() {
    encoder = register_module("encoder", Coder(3, 8, true));
    quant_conv = register_module("quant_conv", Conv(8, 8, 1));
    post_quant_conv = register_module("post_quant_conv", Conv(4, 4, 1));
    decoder = register_module("decoder", Coder(4, 3, false));
  }
  std::optional<std::vector<std::string>> no_split_modules() const override {
    return std::vector<std::string>{"BasicTransformerBlock", "ResnetBlock2D"};
  }
  torch::Tensor forward(const Inputs& in) {
    auto moments = quant_conv(encoder(in.tensors[0]));
    auto mean = moments.slice(1, 0, 4);  // the posterior's mode: deterministic
    return decoder(post_quant_conv(mean));
  }
  static Inputs MakeInputs() {
    torch::manual_seed(0);
    return {{torch::randn({2, 3, 16, 16})}};
  }
  Coder encoder{nullptr}, decoder{nullptr};
  nn::Conv2d quant_conv{nullptr}, post_quant_conv{nullptr};
};
TORCH_MODULE(AutoencoderKL);

// ---- DiTTransformer2DModel --------------------------------------------------------------------

struct PatchEmbedImpl : nn::Module {
  PatchEmbedImpl(int64_t patch_dim, int64_t dim, int64_t tokens) {
    proj = register_module("proj", nn::Linear(patch_dim, dim));
    position_ids = register_buffer("position_ids", torch::arange(tokens, torch::kLong));
    // Recomputed, never saved (persistent=False in diffusers).
    pos_embed = register_buffer("pos_embed", torch::sin(torch::arange(tokens * dim, torch::kFloat)
                                                              .reshape({tokens, dim}) / 7.0));
  }
  torch::Tensor forward(const torch::Tensor& patches) {
    return proj(patches) + pos_embed.index_select(0, position_ids).unsqueeze(0);
  }
  nn::Linear proj{nullptr};
  torch::Tensor position_ids, pos_embed;
};
TORCH_MODULE(PatchEmbed);

struct DiTTransformer2DModelImpl : nn::Module, libtorch::ModelTraits {
  static constexpr int64_t kDim = 32, kTokens = 16, kPatch = 16, kCtx = 16;
  DiTTransformer2DModelImpl() {
    pos_embed = register_module("pos_embed", PatchEmbed(kPatch, kDim, kTokens));
    time_embed = register_module("time_embed", TimestepEmbedding(kDim, kDim));
    transformer_blocks = register_module("transformer_blocks", nn::ModuleList());
    for (int i = 0; i < 4; ++i) transformer_blocks->push_back(BasicTransformerBlock(kDim, kCtx));
    norm_out = register_module("norm_out", nn::LayerNorm(nn::LayerNormOptions({kDim})));
    proj_out = register_module("proj_out", nn::Linear(kDim, kPatch));
  }
  std::optional<std::vector<std::string>> no_split_modules() const override {
    return std::vector<std::string>{"BasicTransformerBlock"};
  }
  std::vector<std::string> non_persistent_buffers() const override { return {"pos_embed.pos_embed"}; }
  torch::Tensor forward(const Inputs& in) {
    auto x = pos_embed(in.tensors[0]) + time_embed(TimestepFeatures(in.tensors[1], kDim)).unsqueeze(1);
    for (const auto& b : *transformer_blocks) x = b->as<BasicTransformerBlock>()->forward(x, in.tensors[2]);
    return proj_out(norm_out(x));
  }
  static Inputs MakeInputs() {
    torch::manual_seed(0);
    return {{torch::randn({2, kTokens, kPatch}), torch::tensor({3, 700}), torch::randn({2, 5, kCtx})}};
  }
  PatchEmbed pos_embed{nullptr};
  TimestepEmbedding time_embed{nullptr};
  nn::ModuleList transformer_blocks{nullptr};
  nn::LayerNorm norm_out{nullptr};
  nn::Linear proj_out{nullptr};
};
TORCH_MODULE(DiTTransformer2DModel);

// A model class that declares no _no_split_modules (diffusers' models without device_map
// support): a string device map must be refused.
struct UndeclaredModelImpl : nn::Module, libtorch::ModelTraits {
  UndeclaredModelImpl() { proj = register_module("proj", nn::Linear(4, 4)); }
  nn::Linear proj{nullptr};
};
TORCH_MODULE(UndeclaredModel);

}  // namespace loadstone::testing::diffusers

#endif  // LOADSTONE_TESTS_DIFFUSERS_MODELS_H_
