// MatchStateDict (include/loadstone/state_dict.h): which checkpoint tensor fills which key of a
// model's state dict.
#include "loadstone/state_dict.h"

#include <unordered_map>
#include <unordered_set>

namespace loadstone {
KeyMatch MatchStateDict(const Checkpoint& checkpoint, const std::vector<ModelKey>& model) {
  std::unordered_map<std::string_view, const ModelKey*> keys;
  for (const ModelKey& k : model) keys.emplace(k.name, &k);
  // Each key takes the first tensor that names it: by its own name, else by its decoded name.
  std::unordered_map<std::string_view, size_t> source;
  const std::vector<TensorInfo>& tensors = checkpoint.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (const std::string* name : {&tensors[i].name, &tensors[i].decoded_name()}) {
      if (keys.contains(*name) && !source.contains(*name)) {
        source.emplace(*name, i);
        break;
      }
    }
  }
  KeyMatch match;
  std::unordered_set<std::string_view> belonging;  // tensors that fill a key or belong to one
  for (const ModelKey& key : model) {
    auto it = source.find(key.name);
    if (it == source.end()) {
      match.missing.push_back(key.name);
      continue;
    }
    const TensorInfo& t = tensors[it->second];
    belonging.insert(t.name);
    const bool dequantized = key.floating && t.packed.has_value();
    if (key.floating) {
      auto companions = checkpoint.Companions(t);  // a missing one is simply not unexpected
      if (companions.ok()) {
        for (const TensorInfo* c : *companions) belonging.insert(c->name);
      }
    }
    const std::vector<uint64_t>& shape = dequantized ? t.packed->element_shape : t.shape;
    if (shape != key.shape) {
      match.mismatched.push_back({key.name, key.shape, shape});
      continue;
    }
    match.fills.push_back({key.name, it->second, dequantized, shape});
  }
  for (const TensorInfo& t : tensors) {
    if (!belonging.contains(t.name)) match.unexpected.push_back(t.name);
  }
  return match;
}

}  // namespace loadstone
