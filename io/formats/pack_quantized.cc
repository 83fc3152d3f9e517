#include "io/formats/pack_quantized.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "io/formats/limits.h"
#include "io/formats/small_reads.h"

namespace loadstone::io {
namespace {

constexpr std::string_view kPacked = "weight_packed";
constexpr std::string_view kDotPacked = ".weight_packed";

uint64_t CeilDiv(uint64_t n, uint64_t d) { return (n + d - 1) / d; }

class Cataloger {
 public:
  Cataloger(const std::vector<CheckpointFile>& files,
            const std::function<TensorInfo*(std::string_view)>& find)
      : files_(files), find_(find), reads_(files) {}

  Status Catalog(TensorInfo* weight, std::string_view module) {
    const std::string prefix(module);
    auto named = [&](std::string_view what) { return fmt::format("{}{}", prefix, what); };
    const TensorInfo* scale = find_(named("weight_scale"));
    const TensorInfo* shape = find_(named("weight_shape"));
    if (scale == nullptr || shape == nullptr) {
      return Status::NotFound(fmt::format(
          "compressed-tensors weight {} has no '{}{}' beside it: every shard of the checkpoint is "
          "needed",
          Where(*weight), prefix, scale == nullptr ? "weight_scale" : "weight_shape"));
    }
    for (const TensorInfo* t : {static_cast<const TensorInfo*>(weight), scale, shape}) {
      if (!t->plain_layout()) {
        return Status::Unsupported(fmt::format(
            "{} is stored strided or big-endian; loadstone reads compressed-tensors weights "
            "stored contiguous and little-endian",
            Where(*t)));
      }
    }
    if (weight->dtype != DType::kI32 || weight->shape.size() != 2 || weight->packed) {
      return Refused(*weight, "is not a 2-D int32 tensor of packed codes");
    }
    auto state = std::make_shared<PackedIntState>();
    LOADSTONE_RETURN_IF_ERROR(ReadShape(*shape, state.get()));
    if (state->rows != weight->shape[0]) {
      return Refused(*weight, fmt::format("has {} rows where '{}' says {}", weight->shape[0],
                                          shape->name, state->rows));
    }
    LOADSTONE_ASSIGN_OR_RETURN(state->bits, CodeWidth(*weight, state->cols));
    LOADSTONE_RETURN_IF_ERROR(ReadScale(*scale, state.get()));
    state->companions = {scale->name, shape->name};
    LOADSTONE_RETURN_IF_ERROR(ReadOptional(prefix, *scale, state.get()));
    PackedLayout layout;
    layout.scheme = fmt::format("ct-int{}", state->bits);
    layout.element_shape = {state->rows, state->cols};
    layout.block_elems = 32 / state->bits;  // codes a word
    layout.block_bytes = 4;
    layout.decoded_name = named("weight");
    layout.packed_int = std::move(state);
    weight->packed = std::move(layout);
    return Status::OK();
  }

 private:
  std::string Where(const TensorInfo& t) const { return TensorAt(files_, t); }
  Status Refused(const TensorInfo& t, std::string_view why) const {
    return Status::Corruption(fmt::format("compressed-tensors {} {}", Where(t), why));
  }

  // The code width whose words fill `weight`'s packed rows of `cols` columns exactly; with few
  // columns two widths can (8 columns: one word of 2- or 4-bit codes), and a guess would decode
  // wrong values: Unsupported then.
  Result<uint32_t> CodeWidth(const TensorInfo& weight, uint64_t cols) const {
    std::vector<uint32_t> widths;
    for (uint32_t bits : {2u, 4u, 8u}) {
      if (CeilDiv(cols * bits, 32) == weight.shape[1]) widths.push_back(bits);
    }
    if (widths.empty()) {
      return Refused(weight, fmt::format("has {} words a row, which no code width of 2, 4 or 8 "
                                         "bits makes of {} columns",
                                         weight.shape[1], cols));
    }
    if (widths.size() > 1) {
      return Status::Unsupported(fmt::format(
          "compressed-tensors {}: {} words a row of {} columns fit codes of {} and {} bits, and "
          "loadstone tells the width from the shape",
          Where(weight), weight.shape[1], cols, widths[0], widths[1]));
    }
    return widths.front();
  }

  // The companions a weight may have, PREFIX.weight_zero_point and PREFIX.weight_g_idx, read
  // into `state` and added to its companions; without a g_idx the groups (of `scale`) must
  // divide the columns.
  Status ReadOptional(const std::string& prefix, const TensorInfo& scale, PackedIntState* state) {
    if (const TensorInfo* zp = find_(prefix + "weight_zero_point")) {
      LOADSTONE_RETURN_IF_ERROR(ReadZeroPoint(*zp, state));
      state->companions.push_back(zp->name);
    }
    if (const TensorInfo* g_idx = find_(prefix + "weight_g_idx")) {
      LOADSTONE_RETURN_IF_ERROR(ReadGIdx(*g_idx, state));
      state->companions.push_back(g_idx->name);
    } else if (state->cols % state->groups != 0) {
      return Refused(scale, fmt::format("has {} groups, which do not divide {} columns (and there "
                                        "is no weight_g_idx)",
                                        state->groups, state->cols));
    }
    return Status::OK();
  }

  Status ReadShape(const TensorInfo& shape, PackedIntState* state) {
    if ((shape.dtype != DType::kI64 && shape.dtype != DType::kI32) || shape.numel() != 2) {
      return Refused(shape, "is not two integers [out, in]");
    }
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw, reads_.Bytes(shape));
    int64_t dims[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      if (shape.dtype == DType::kI64) {
        std::memcpy(&dims[i], raw.data() + 8 * i, 8);
      } else {
        int32_t d;
        std::memcpy(&d, raw.data() + 4 * i, 4);
        dims[i] = d;
      }
    }
    if (dims[0] <= 0 || dims[1] <= 0 || dims[0] > (int64_t{1} << 31) ||
        dims[1] > (int64_t{1} << 31)) {
      return Refused(shape, fmt::format("holds [{}, {}], not two positive dimensions below 2^31",
                                        dims[0], dims[1]));
    }
    state->rows = static_cast<uint64_t>(dims[0]);
    state->cols = static_cast<uint64_t>(dims[1]);
    return Status::OK();
  }

  // [out, groups] (group or channel). A per-tensor scale ([] or [1]) is refused: loadstone has
  // not met one in a pack-quantized checkpoint.
  Status ReadScale(const TensorInfo& scale, PackedIntState* state) {
    if (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16 && scale.dtype != DType::kF16) {
      return Refused(scale, fmt::format("is {}; scales are float32, bfloat16 or float16",
                                        TorchName(scale.dtype)));
    }
    state->scale_dtype = scale.dtype;
    const bool per_row = scale.shape.size() == 2 && scale.shape[0] == state->rows &&
                         scale.shape[1] >= 1 && scale.shape[1] <= state->cols;
    if (!per_row) {
      return Refused(
          scale, fmt::format("has shape [{}]; a weight of {} x {} needs [{}, groups]",
                             fmt::join(scale.shape, ", "), state->rows, state->cols, state->rows));
    }
    state->groups = scale.shape[1];
    state->group_size = state->cols / state->groups;
    return Status::OK();
  }

  // Packed along the output dim like the codes along the input one: [ceil(out * bits / 32),
  // groups] int32, each value stored + 2^(bits-1).
  Status ReadZeroPoint(const TensorInfo& zp, PackedIntState* state) {
    const uint64_t per_word = 32 / state->bits;
    if (zp.dtype != DType::kI32 || zp.shape.size() != 2 ||
        zp.shape[0] != CeilDiv(state->rows, per_word) || zp.shape[1] != state->groups ||
        !zp.plain_layout()) {
      return Refused(zp, fmt::format("has shape [{}] of {}; it needs int32 [{}, {}] (zero points "
                                     "packed along the output dim)",
                                     fmt::join(zp.shape, ", "), TorchName(zp.dtype),
                                     CeilDiv(state->rows, per_word), state->groups));
    }
    LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw,
                               ReadTable(&reads_, files_, zp, "zero points"));
    const uint32_t mask = (1u << state->bits) - 1;
    state->zeros.resize(state->rows * state->groups);
    for (uint64_t r = 0; r < state->rows; ++r) {
      for (uint64_t g = 0; g < state->groups; ++g) {
        uint32_t word;
        std::memcpy(&word, raw.data() + 4 * ((r / per_word) * state->groups + g), 4);
        const uint32_t u = (word >> (state->bits * (r % per_word))) & mask;
        state->zeros[r * state->groups + g] = static_cast<int16_t>(u);  // stored + 2^(bits-1)
      }
    }
    return Status::OK();
  }

  Status ReadGIdx(const TensorInfo& g_idx, PackedIntState* state) {
    return ReadGroupIndex(&reads_, files_, g_idx, *state, "compressed-tensors", &state->g_idx);
  }

  const std::vector<CheckpointFile>& files_;
  const std::function<TensorInfo*(std::string_view)>& find_;
  SmallReads reads_;
};

}  // namespace

Result<std::vector<std::byte>> ReadTable(SmallReads* reads, const std::vector<CheckpointFile>& files,
                                         const TensorInfo& t, std::string_view what) {
  if (t.nbytes > kMaxPackedIntTableBytes) {
    return BeyondBound(TensorAt(files, t), fmt::format("{} bytes of {}", t.nbytes, what),
                       "kMaxPackedIntTableBytes", kMaxPackedIntTableBytes);
  }
  return reads->Bytes(t);
}

Status ReadGroupIndex(SmallReads* reads, const std::vector<CheckpointFile>& files,
                      const TensorInfo& g_idx, const PackedIntState& state,
                      std::string_view producer, std::vector<int32_t>* out) {
  const uint64_t cols = state.cols;
  if (g_idx.dtype != DType::kI32 || g_idx.shape != std::vector<uint64_t>{cols} ||
      !g_idx.plain_layout()) {
    return Status::Corruption(fmt::format("{} {} is not int32 [{}] (a group for each column)",
                                          producer, TensorAt(files, g_idx), cols));
  }
  LOADSTONE_ASSIGN_OR_RETURN(std::vector<std::byte> raw, ReadTable(reads, files, g_idx, "g_idx"));
  out->resize(cols);
  std::memcpy(out->data(), raw.data(), raw.size());
  for (uint64_t c = 0; c < cols; ++c) {
    if ((*out)[c] < 0 || static_cast<uint64_t>((*out)[c]) >= state.groups) {
      return Status::Corruption(fmt::format("{} {} gives column {} group {}; there are {} groups",
                                            producer, TensorAt(files, g_idx), c, (*out)[c],
                                            state.groups));
    }
  }
  return Status::OK();
}

Status CatalogPackQuantized(const std::vector<CheckpointFile>& files,
                            std::vector<TensorInfo>* tensors,
                            const std::function<TensorInfo*(std::string_view)>& find) {
  Cataloger cataloger(files, find);
  for (TensorInfo& t : *tensors) {
    if (t.name != kPacked && !t.name.ends_with(kDotPacked)) continue;
    LOADSTONE_RETURN_IF_ERROR(
        cataloger.Catalog(&t, std::string_view(t.name).substr(0, t.name.size() - kPacked.size())));
  }
  return Status::OK();
}

}  // namespace loadstone::io
