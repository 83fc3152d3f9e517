// Matching a checkpoint against a model's state dict: which tensor fills which key, and what is
// missing, unexpected or of another shape — the one rule behind the LibTorch face's LoadInto
// (torch.h) and the Python package's load_into, so that both report the same keys.
//
//   std::vector<loadstone::ModelKey> keys = ...;   // the model's state-dict entries
//   loadstone::KeyMatch match = loadstone::MatchStateDict(*ckpt, keys);
//   for (const auto& fill : match.fills) ...       // key <- checkpoint tensor
#ifndef LOADSTONE_STATE_DICT_H_
#define LOADSTONE_STATE_DICT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"

namespace loadstone {

// One entry of a model's state dict (a parameter or a persistent buffer).
struct ModelKey {
  std::string name;
  std::vector<uint64_t> shape;
  // Of a floating-point dtype: a quantized weight (packed, or float8 with scales) loaded into it
  // is dequantized, and its quant state (absmax, scales, ...) belongs to it.
  bool floating = false;
};

struct KeyFill {
  std::string key;     // the model's key
  size_t tensor = 0;   // index into Checkpoint::tensors()
  bool dequantized = false;  // a quantized weight decoded into the key's floating dtype
  std::vector<uint64_t> shape;  // the tensor's shape once loaded into the key
};

struct ShapeMismatch {
  std::string key;
  std::vector<uint64_t> expected;  // the model's
  std::vector<uint64_t> found;     // the checkpoint's, once loaded
};

struct KeyMatch {
  // Keys a tensor fills, in model order: the tensor of the key's own name, else the one whose
  // decoded name it is (a dequantized compressed-tensors or GPTQ weight's "M.weight"), with the
  // key's shape.
  std::vector<KeyFill> fills;
  // Model keys no tensor fills, in model order.
  std::vector<std::string> missing;
  // Checkpoint tensors that fill no key and belong to none that is dequantized (its companions),
  // in catalog order.
  std::vector<std::string> unexpected;
  // Keys whose tensor has another shape (neither filled nor missing), in model order.
  std::vector<ShapeMismatch> mismatched;
};

KeyMatch MatchStateDict(const Checkpoint& checkpoint, const std::vector<ModelKey>& model);

}  // namespace loadstone

#endif  // LOADSTONE_STATE_DICT_H_
