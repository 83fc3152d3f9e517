// LoadInto's keys: a module's state dict against a checkpoint's tensors (the one rule of
// state_dict.h), what the report says of them, and the refusals transformers and torch make.
// Internal to bindings/torch.
#ifndef LOADSTONE_BINDINGS_TORCH_MODEL_KEYS_H_
#define LOADSTONE_BINDINGS_TORCH_MODEL_KEYS_H_

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "loadstone/checkpoint.h"
#include "loadstone/state_dict.h"
#include "loadstone/torch.h"

namespace loadstone::libtorch {

// The model's keys, from its state dict (PersistentStateDict), for MatchStateDict.
std::vector<ModelKey> ModelKeys(const std::vector<std::pair<std::string, at::Tensor>>& state);

// The report's keys from `match`; InvalidArgument (transformers' message, naming `path`) for the
// first shape mismatch, unless options.ignore_mismatched_sizes.
Result<LoadReport> ReportKeys(const KeyMatch& match, const std::string& path,
                              const TorchLoadOptions& options);

// With options.strict, InvalidArgument (torch's message) when keys are missing or unexpected;
// otherwise OK.
Status RefuseUnmatched(const torch::nn::Module& model, const LoadReport& report,
                       const TorchLoadOptions& options);

// The tensors to load (by checkpoint name), each with the model tensor it fills.
struct Fills {
  std::unordered_set<std::string> include;
  std::unordered_map<std::string, at::Tensor> param_of;
};

// The fills of `match`; `target`: the model's tensors by key, holding every key a fill names.
Fills FillsOf(const Checkpoint& checkpoint, const KeyMatch& match,
              const std::unordered_map<std::string, at::Tensor>& target);

}  // namespace loadstone::libtorch

#endif  // LOADSTONE_BINDINGS_TORCH_MODEL_KEYS_H_
