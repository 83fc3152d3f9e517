#include "tools/loadstone/demo_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"

namespace loadstone::cli {
namespace {

struct Spec {
  std::string name;
  std::vector<uint64_t> shape;
};

std::vector<Spec> Tensors(const DemoModelShape& s) {
  const uint64_t h = s.hidden, i = s.intermediate, kv = s.hidden / s.kv_heads_ratio;
  std::vector<Spec> out;
  out.push_back({"model.embed_tokens.weight", {uint64_t(s.vocab), h}});
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    out.push_back({p + "self_attn.q_proj.weight", {h, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, h}});
    out.push_back({p + "mlp.gate_proj.weight", {i, h}});
    out.push_back({p + "mlp.up_proj.weight", {i, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, i}});
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  out.push_back({"model.norm.weight", {h}});
  out.push_back({"lm_head.weight", {uint64_t(s.vocab), h}});
  return out;
}

// Deterministic bf16 values in about [-0.06, 0.06]: a hash of (tensor, element).
void Fill(uint64_t seed, uint64_t offset, std::span<std::byte> chunk) {
  for (size_t k = 0; k < chunk.size(); k += 2) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + (offset + k) / 2;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    // bf16: sign random, exponent 2^-9..2^-5, mantissa random.
    const uint16_t bits = static_cast<uint16_t>(((x & 1) << 15) | ((118 + (x >> 8) % 5) << 7) |
                                                ((x >> 16) & 0x7F));
    chunk[k] = static_cast<std::byte>(bits & 0xFF);
    if (k + 1 < chunk.size()) chunk[k + 1] = static_cast<std::byte>(bits >> 8);
  }
}

}  // namespace

uint64_t DemoModelBytes(const DemoModelShape& shape) {
  uint64_t total = 0;
  for (const Spec& t : Tensors(shape)) {
    uint64_t n = 2;
    for (uint64_t d : t.shape) n *= d;
    total += n;
  }
  return total;
}

std::string DefaultCacheDir() {
  if (const char* dir = std::getenv("LOADSTONE_CACHE"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return std::string(xdg) + "/loadstone";
  }
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/loadstone";
}

Result<std::string> EnsureDemoModel(const std::string& folder, const DemoModelShape& shape) {
  if (auto existing = Checkpoint::Open(folder);
      existing.ok() && existing->total_bytes() == DemoModelBytes(shape)) {
    return folder;
  }
  const std::vector<Spec> specs = Tensors(shape);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorToWrite t{specs[i].name, DType::kBF16, specs[i].shape, {}, {}};
    t.fill = [seed = i + 1](uint64_t offset, std::span<std::byte> chunk) {
      Fill(seed, offset, chunk);
      return Status::OK();
    };
    tensors.push_back(std::move(t));
  }
  // Write into a sibling folder, then rename: an interrupted run never leaves a half model.
  const std::string partial = folder + ".partial";
  std::error_code ec;
  std::filesystem::remove_all(partial, ec);
  ShardedWriteOptions options;
  options.max_shard_size = shape.max_shard_size;
  options.metadata = {{"format", "pt"}};
  LOADSTONE_ASSIGN_OR_RETURN(auto written, WriteShardedSafetensors(partial, tensors, options));
  // On disk before the first load: O_DIRECT reads of dirty pages would wait for writeback.
  for (const std::string& path : written) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::close(fd);
    }
  }
  std::filesystem::remove_all(folder, ec);
  std::filesystem::rename(partial, folder, ec);
  if (ec) {
    return Status::IOError(fmt::format("cannot move '{}' to '{}': {}", partial, folder,
                                       ec.message()));
  }
  return folder;
}

}  // namespace loadstone::cli
