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
#include "tools/loadstone/output.h"

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

Result<std::string> EnsureDemoModel(const std::string& folder, const DemoModelShape& shape,
                                    const std::function<bool()>& cancelled) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool marked = fs::exists(fs::path(folder) / kDemoMarker, ec);
  if (auto existing = Checkpoint::Open(folder);
      existing.ok() && existing->total_bytes() == DemoModelBytes(shape)) {
    // A complete demo model, marked or made before the marker: read, never changed.
    return folder;
  }
  StagedOutput::Options where;
  where.kind = StagedOutput::Kind::kFolder;
  where.what = "demo --dir";
  // Only a folder the demo made (its marker inside) is replaced; anything else is the user's.
  where.may_replace = [marked, folder](const std::string&) {
    if (marked) return Status::OK();
    return Status::InvalidArgument(fmt::format(
        "demo --dir '{}' holds files the demo did not make (no {} inside): it is left as it "
        "is; give --dir a new or empty folder",
        folder, kDemoMarker));
  };
  LOADSTONE_ASSIGN_OR_RETURN(auto out, StagedOutput::Begin(folder, std::move(where)));
  const std::vector<Spec> specs = Tensors(shape);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    TensorToWrite t{specs[i].name, DType::kBF16, specs[i].shape, {}, {}};
    t.fill = [seed = i + 1, &cancelled](uint64_t offset, std::span<std::byte> chunk) {
      if (cancelled && cancelled()) return Status::Cancelled("cancelled (Ctrl-C)");
      Fill(seed, offset, chunk);
      return Status::OK();
    };
    tensors.push_back(std::move(t));
  }
  ShardedWriteOptions options;
  options.max_shard_size = shape.max_shard_size;
  options.metadata = {{"format", "pt"}};
  LOADSTONE_ASSIGN_OR_RETURN(auto written, WriteShardedSafetensors(out->path(), tensors, options));
  {
    std::ofstream marker(fs::path(out->path()) / kDemoMarker);
    marker << "made by `loadstone demo`; the demo replaces this folder when its model changes\n";
    if (!marker) {
      return Status::IOError(fmt::format("cannot write '{}/{}'", out->path(), kDemoMarker));
    }
  }
  // On disk before the first load: O_DIRECT reads of dirty pages would wait for writeback.
  for (const std::string& path : written) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::fdatasync(fd);
      ::close(fd);
    }
  }
  LOADSTONE_RETURN_IF_ERROR(out->Commit());
  return folder;
}

}  // namespace loadstone::cli
