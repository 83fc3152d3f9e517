#include "io/formats/gptq_awq.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

#include "io/formats/limits.h"
#include "io/formats/pack_quantized.h"
#include "io/formats/small_reads.h"

namespace loadstone::io {
namespace {

constexpr std::string_view kQweight = "qweight";
constexpr std::string_view kDotQweight = ".qweight";

enum class Producer { kGptq, kAwq };

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

uint64_t CeilDiv(uint64_t n, uint64_t d) { return (n + d - 1) / d; }

// Code `index` of the LSB-first bit stream of `bits`-bit codes in `words` (GPTQ: 3-bit codes
// straddle words).
uint32_t StreamCode(const std::byte* words, uint64_t index, uint32_t bits) {
  const uint64_t bit = index * bits;
  const unsigned shift = bit % 32;
  uint32_t lo = 0;
  std::memcpy(&lo, words + 4 * (bit / 32), 4);
  uint32_t v = lo >> shift;
  if (shift + bits > 32) {
    uint32_t hi = 0;
    std::memcpy(&hi, words + 4 * (bit / 32 + 1), 4);
    v |= hi << (32 - shift);
  }
  return v & ((1u << bits) - 1);
}

// AWQ's word c holds outputs 8c .. 8c + 7 in this nibble order.
constexpr unsigned kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

class Cataloger {
 public:
  Cataloger(const std::vector<CheckpointFile>& files, const ModelConfig& config,
            const std::function<TensorInfo*(std::string_view)>& find, Producer producer)
      : files_(files), config_(config), find_(find), producer_(producer), reads_(files) {}

  Status Catalog(TensorInfo* weight, std::string_view module) {
    const std::string prefix(module);
    auto named = [&](std::string_view what) { return fmt::format("{}{}", prefix, what); };
    const TensorInfo* qzeros = find_(named("qzeros"));
    const TensorInfo* scales = find_(named("scales"));
    const TensorInfo* g_idx = producer_ == Producer::kGptq ? find_(named("g_idx")) : nullptr;
    if (qzeros == nullptr || scales == nullptr) {
      return Status::NotFound(fmt::format(
          "{} weight {} has no '{}{}' beside it: every shard of the checkpoint is needed", Name(),
          Where(*weight), prefix, qzeros == nullptr ? "qzeros" : "scales"));
    }
    LOADSTONE_RETURN_IF_ERROR(CheckStored(*weight, *qzeros, *scales, g_idx));
    auto state = std::make_shared<PackedIntState>();
    state->scale_dtype = scales->dtype;
    state->groups = scales->shape[0];
    LOADSTONE_RETURN_IF_ERROR(producer_ == Producer::kGptq
                                  ? GptqShape(*weight, *qzeros, state.get())
                                  : AwqShape(*weight, *qzeros, state.get()));
    if (scales->shape[1] != state->rows) {
      return Refused(*scales, fmt::format("has {} outputs where '{}' has {}", scales->shape[1],
                                          weight->name, state->rows));
    }
    if (state->rows > (uint64_t{1} << 31) || state->cols > (uint64_t{1} << 31) ||
        state->groups > state->cols) {
      return Refused(*weight, fmt::format("is {} x {} in {} groups: not below 2^31 with at most "
                                          "a group a column",
                                          state->rows, state->cols, state->groups));
    }
    LOADSTONE_RETURN_IF_ERROR(GroupsOf(*scales, g_idx, state.get()));
    LOADSTONE_RETURN_IF_ERROR(ReadZeros(*qzeros, state.get()));
    state->companions = {scales->name, qzeros->name};
    if (g_idx != nullptr) state->companions.push_back(g_idx->name);
    PackedLayout layout;
    layout.scheme = producer_ == Producer::kAwq
                        ? "awq-int4"
                        : fmt::format("{}-int{}", v2_ ? "gptq_v2" : "gptq", state->bits);
    layout.element_shape = {state->rows, state->cols};
    layout.block_elems = 32 / state->bits;  // codes a word (3-bit: 10 and some)
    layout.block_bytes = 4;
    layout.decoded_name = named("weight");
    layout.packed_int = std::move(state);
    weight->packed = std::move(layout);
    return Status::OK();
  }

  // The checkpoint format the config names (GPTQ): v1 unless "gptq_v2".
  Status ReadFormat() {
    const std::string format = Lower(config_.checkpoint_format);
    if (producer_ != Producer::kGptq || format.empty() || format == "gptq") return Status::OK();
    if (format == "gptq_v2") {
      v2_ = true;
      return Status::OK();
    }
    return Status::Unsupported(fmt::format(
        "{}: GPTQ checkpoint_format '{}'; loadstone dequantizes 'gptq' (v1) and 'gptq_v2'",
        config_.path, config_.checkpoint_format));
  }

 private:
  std::string_view Name() const { return producer_ == Producer::kGptq ? "GPTQ" : "AWQ"; }
  std::string Where(const TensorInfo& t) const { return TensorAt(files_, t); }
  Status Refused(const TensorInfo& t, std::string_view why) const {
    return Status::Corruption(fmt::format("{} {} {}", Name(), Where(t), why));
  }

  // The weight, its companions and g_idx (when there is one) stored plain, of the dtypes and
  // ranks GPTQ and AWQ write: int32 2-D codes and zero points, float 2-D scales [groups, out].
  Status CheckStored(const TensorInfo& weight, const TensorInfo& qzeros, const TensorInfo& scales,
                     const TensorInfo* g_idx) const {
    for (const TensorInfo* t : {&weight, &qzeros, &scales, g_idx}) {
      if (t != nullptr && !t->plain_layout()) {
        return Status::Unsupported(fmt::format(
            "{} is stored strided or big-endian; loadstone reads {} weights stored contiguous and "
            "little-endian",
            Where(*t), Name()));
      }
    }
    if (weight.dtype != DType::kI32 || weight.shape.size() != 2 || weight.packed) {
      return Refused(weight, "is not a 2-D int32 tensor of packed codes");
    }
    if (qzeros.dtype != DType::kI32 || qzeros.shape.size() != 2) {
      return Refused(qzeros, "is not a 2-D int32 tensor of packed zero points");
    }
    if ((scales.dtype != DType::kF16 && scales.dtype != DType::kBF16 &&
         scales.dtype != DType::kF32) ||
        scales.shape.size() != 2 || scales.shape[0] == 0) {
      return Refused(scales,
                     fmt::format("is {} [{}]; scales are float16, bfloat16 or float32 "
                                 "[groups, out]",
                                 TorchName(scales.dtype), fmt::join(scales.shape, ", ")));
    }
    return Status::OK();
  }

  // qweight [in * bits / 32, out], qzeros [groups, out * bits / 32]: the width from qzeros.
  Status GptqShape(const TensorInfo& weight, const TensorInfo& qzeros, PackedIntState* state) {
    state->order = PackOrder::kGptq;
    state->rows = weight.shape[1];
    const uint64_t zero_words = qzeros.shape[1];
    state->bits = 0;
    for (uint32_t bits : {2u, 3u, 4u, 8u}) {
      if (state->rows * bits == zero_words * 32) state->bits = bits;
    }
    if (state->rows == 0 || state->bits == 0 || qzeros.shape[0] != state->groups) {
      return Refused(qzeros, fmt::format("is [{}]; for {} groups of {} outputs it needs [{}, "
                                         "out * bits / 32] with bits 2, 3, 4 or 8",
                                         fmt::join(qzeros.shape, ", "), state->groups, state->rows,
                                         state->groups));
    }
    if (config_.bits && *config_.bits != state->bits) {
      return Refused(qzeros, fmt::format("packs {}-bit zero points where the config says bits {}",
                                         state->bits, *config_.bits));
    }
    if (weight.shape[0] == 0 || weight.shape[0] * 32 % state->bits != 0) {
      return Refused(weight, fmt::format("has {} rows of words, which hold no whole number of "
                                         "{}-bit codes a column",
                                         weight.shape[0], state->bits));
    }
    state->cols = weight.shape[0] * 32 / state->bits;
    return Status::OK();
  }

  // qweight [in, out / 8], qzeros [groups, out / 8]: 4-bit GEMM only.
  Status AwqShape(const TensorInfo& weight, const TensorInfo& qzeros, PackedIntState* state) {
    const std::string version = Lower(config_.version);
    if ((config_.bits && *config_.bits != 4) || (!version.empty() && version != "gemm")) {
      return Status::Unsupported(fmt::format(
          "AWQ {}: the config says bits {}, version '{}'; loadstone dequantizes 4-bit AWQ in its "
          "GEMM layout",
          Where(weight), config_.bits.value_or(4), config_.version));
    }
    state->order = PackOrder::kAwq;
    state->bits = 4;
    state->rows = weight.shape[1] * 8;
    state->cols = weight.shape[0];
    if (state->rows == 0 || state->cols == 0 ||
        qzeros.shape != std::vector<uint64_t>{state->groups, weight.shape[1]}) {
      return Refused(qzeros, fmt::format("is [{}]; {} groups of {} outputs need [{}, {}]",
                                         fmt::join(qzeros.shape, ", "), state->groups, state->rows,
                                         state->groups, weight.shape[1]));
    }
    return Status::OK();
  }

  // The group of each column: g_idx when there is one, else consecutive groups of the config's
  // group_size (-1: one group), else of cols / groups.
  Status GroupsOf(const TensorInfo& scales, const TensorInfo* g_idx, PackedIntState* state) {
    if (g_idx != nullptr) {
      state->group_size = CeilDiv(state->cols, state->groups);
      return ReadGroupIndex(&reads_, files_, *g_idx, *state, Name(), &state->g_idx);
    }
    uint64_t size = 0;
    if (config_.group_size) {
      size = *config_.group_size == -1 ? state->cols : static_cast<uint64_t>(*config_.group_size);
    } else if (state->cols % state->groups == 0) {
      size = state->cols / state->groups;
    }
    const bool fits =
        size > 0 && (producer_ == Producer::kAwq ? size * state->groups == state->cols
                                                 : CeilDiv(state->cols, size) == state->groups);
    if (!fits) {
      return Refused(
          scales, fmt::format("has {} groups for {} columns, which {} does not make", state->groups,
                              state->cols,
                              config_.group_size
                                  ? fmt::format("the config's group_size {}", *config_.group_size)
                                  : std::string("no g_idx or group_size")));
    }
    state->group_size = size;
    return Status::OK();
  }

  // Each (output, group)'s zero: GPTQ v1 stored zero - 1 (2/4/8 bits wrap, as AutoGPTQ adds
  // the 1 back under the mask; 3-bit does not), v2 and AWQ the zero itself.
  Status ReadZeros(const TensorInfo& qzeros, PackedIntState* state) {
    if (state->rows * state->groups * sizeof(int16_t) > kMaxPackedIntTableBytes) {
      return BeyondBound(Where(qzeros),
                         fmt::format("{} x {} zero points unpacked (2 bytes each)", state->rows,
                                     state->groups),
                         "kMaxPackedIntTableBytes", kMaxPackedIntTableBytes);
    }
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw,
                               ReadTable(&reads_, files_, qzeros, "zero points"));
    const uint64_t row_words = qzeros.shape[1];
    const uint32_t mask = (1u << state->bits) - 1;
    state->zeros.resize(state->rows * state->groups);
    for (uint64_t g = 0; g < state->groups; ++g) {
      const std::byte* row = raw.data() + 4 * g * row_words;
      for (uint64_t o = 0; o < state->rows; ++o) {
        uint32_t z = 0;
        if (producer_ == Producer::kAwq) {
          uint32_t word = 0;
          std::memcpy(&word, row + 4 * (o / 8), 4);
          z = (word >> (4 * kAwqNibble[o % 8])) & mask;
        } else {
          z = StreamCode(row, o, state->bits);
          if (!v2_) z = state->bits == 3 ? z + 1 : (z + 1) & mask;
        }
        state->zeros[o * state->groups + g] = static_cast<int16_t>(z);
      }
    }
    return Status::OK();
  }

  const std::vector<CheckpointFile>& files_;
  const ModelConfig& config_;
  const std::function<TensorInfo*(std::string_view)>& find_;
  const Producer producer_;
  SmallReads reads_;
  bool v2_ = false;
};

}  // namespace

Status CatalogGptqAwq(const std::vector<CheckpointFile>& files, const ModelConfig& config,
                      std::vector<TensorInfo>* tensors,
                      const std::function<TensorInfo*(std::string_view)>& find,
                      std::vector<std::string>* warnings) {
  std::vector<TensorInfo*> weights;
  for (TensorInfo& t : *tensors) {
    if (t.name == kQweight || t.name.ends_with(kDotQweight)) weights.push_back(&t);
  }
  if (weights.empty()) return Status::OK();
  auto module = [](const TensorInfo& t) {
    return std::string_view(t.name).substr(0, t.name.size() - kQweight.size());
  };
  const std::string method = Lower(config.quant_method);
  std::optional<Producer> producer;
  if (method == "gptq") producer = Producer::kGptq;
  if (method == "awq") producer = Producer::kAwq;
  if (!producer && method.empty() &&
      find(fmt::format("{}g_idx", module(*weights.front()))) != nullptr) {
    producer = Producer::kGptq;  // only GPTQ writes a g_idx beside its qweight
    warnings->push_back(fmt::format(
        "{} qweight tensors and no quantization config: read as GPTQ v1 (they have a g_idx); "
        "put the model's config.json or quantize_config.json beside them to say so",
        weights.size()));
  }
  if (!producer) {
    warnings->push_back(fmt::format(
        "{} qweight tensors, but no quantization config names gptq or awq{}: loaded as stored, "
        "not dequantized",
        weights.size(),
        method.empty() ? std::string() : fmt::format(" (quant_method '{}')", config.quant_method)));
    return Status::OK();
  }
  Cataloger cataloger(files, config, find, *producer);
  LOADSTONE_RETURN_IF_ERROR(cataloger.ReadFormat());
  for (TensorInfo* t : weights) LOADSTONE_RETURN_IF_ERROR(cataloger.Catalog(t, module(*t)));
  return Status::OK();
}

}  // namespace loadstone::io
