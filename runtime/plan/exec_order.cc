#include "runtime/plan/exec_order.h"

#include <algorithm>
#include <charconv>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "runtime/device_map/module_tree.h"
#include "runtime/plan/pp_rules.h"

namespace loadstone::planning {
namespace {

std::optional<uint64_t> Number(std::string_view part) {
  uint64_t n = 0;
  if (part.empty() || part[0] < '0' || part[0] > '9') return std::nullopt;  // most names
  if (std::from_chars(part.data(), part.data() + part.size(), n).ptr != part.data() + part.size()) {
    return std::nullopt;
  }
  return n;
}

// What a module does in the model, by its name, in the order the model runs them; a name no rule
// knows is body, ordered by name among the others.
enum class Role : uint8_t { kInput, kBody, kNorm, kHead, kMtp };

struct Known {
  std::string_view name;
  Role role;
  int rank;  // among the modules of its role
};

constexpr int kUnknownRank = 10;

// Hugging Face names (transformers, diffusers, GGUF's llama.cpp names) whose place is known.
constexpr Known kKnown[] = {
    // The inputs, as diffusers' and Flux's models take them: the image, the time, then the rest,
    // the text's last.
    {"x_embedder", Role::kInput, 0}, {"img_in", Role::kInput, 0}, {"pos_embed", Role::kInput, 0},
    {"patch_embed", Role::kInput, 0}, {"patch_embedding", Role::kInput, 0},
    {"time_proj", Role::kInput, 1}, {"time_embedding", Role::kInput, 1},
    {"time_embed", Role::kInput, 1}, {"time_text_embed", Role::kInput, 1},
    {"time_in", Role::kInput, 1}, {"guidance_in", Role::kInput, 1},
    {"vector_in", Role::kInput, 1}, {"context_embedder", Role::kInput, 3},
    {"txt_in", Role::kInput, 3}, {"encoder_hid_proj", Role::kInput, 3},
    {"embed_tokens", Role::kInput, 2}, {"embed_positions", Role::kInput, 2},
    {"embed", Role::kInput, 2}, {"embeddings", Role::kInput, 2}, {"embedding", Role::kInput, 2},
    {"wte", Role::kInput, 2}, {"wpe", Role::kInput, 2}, {"word_embeddings", Role::kInput, 2},
    {"position_embeddings", Role::kInput, 2}, {"tok_embeddings", Role::kInput, 2},
    {"token_embd", Role::kInput, 2}, {"shared", Role::kInput, 2}, {"rotary_emb", Role::kInput, 2},
    {"conv_in", Role::kInput, 2}, {"class_embedding", Role::kInput, 1},
    {"add_embedding", Role::kInput, 1}, {"add_time_proj", Role::kInput, 1},
    // The body: encoders before what takes their output.
    {"vision_tower", Role::kBody, 0}, {"vision_model", Role::kBody, 0},
    {"visual", Role::kBody, 0}, {"vision_encoder", Role::kBody, 0},
    {"image_encoder", Role::kBody, 0}, {"audio_tower", Role::kBody, 0},
    {"audio_encoder", Role::kBody, 0}, {"encoder", Role::kBody, 1},
    {"quant_conv", Role::kBody, 2}, {"multi_modal_projector", Role::kBody, 3},
    {"mm_projector", Role::kBody, 3}, {"post_quant_conv", Role::kBody, 4},
    {"down_blocks", Role::kBody, 5}, {"mid_block", Role::kBody, 6}, {"up_blocks", Role::kBody, 7},
    {"transformer_blocks", Role::kBody, 8}, {"double_blocks", Role::kBody, 8},
    {"joint_blocks", Role::kBody, 8}, {"single_transformer_blocks", Role::kBody, 9},
    {"single_blocks", Role::kBody, 9},
    // The final norm, then the head.
    {"norm", Role::kNorm, 0}, {"norm_f", Role::kNorm, 0}, {"ln_f", Role::kNorm, 0},
    {"final_layernorm", Role::kNorm, 0}, {"final_layer_norm", Role::kNorm, 0},
    {"final_norm", Role::kNorm, 0}, {"layer_norm", Role::kNorm, 0},
    {"post_layernorm", Role::kNorm, 0}, {"norm_out", Role::kNorm, 0},
    {"conv_norm_out", Role::kNorm, 0}, {"conv_act", Role::kNorm, 0},
    {"output_norm", Role::kNorm, 0}, {"conv_out", Role::kHead, 0}, {"proj_out", Role::kHead, 0},
    {"lm_head", Role::kHead, 0}, {"head", Role::kHead, 0}, {"output", Role::kHead, 0},
    {"score", Role::kHead, 0}, {"classifier", Role::kHead, 0}, {"final_layer", Role::kHead, 0},
    {"pooler", Role::kHead, 0}, {"visual_projection", Role::kHead, 0},
    {"text_projection", Role::kHead, 0},
};

std::pair<Role, int> RoleOf(std::string_view part) {
  if (IsMtpComponent(part)) return {Role::kMtp, 0};
  // kKnown by name, made once: a lookup for each name component of every tensor.
  static const std::unordered_map<std::string_view, std::pair<Role, int>> known = [] {
    std::unordered_map<std::string_view, std::pair<Role, int>> by_name;
    for (const Known& k : kKnown) by_name.emplace(k.name, std::pair(k.role, k.rank));
    return by_name;
  }();
  if (const auto it = known.find(part); it != known.end()) return it->second;
  return {Role::kBody, kUnknownRank};
}

// A module the rules place as a whole (an embedding, a final norm, a head, a mid block): one
// module of the order, whatever modules it holds.
bool IsOneModule(std::string_view part) {
  const Role role = RoleOf(part).first;
  return part == "mid_block" || role == Role::kInput || role == Role::kNorm ||
         role == Role::kHead;
}

// The modules of the order as a tree of their dotted components, walked in execution order.
class OrderTree {
 public:
  OrderTree(const ModelConfig& config, const ModuleTree* model)
      : config_(config),
        model_(model ? &ModuleTreeAccess::Get(*model) : nullptr) {
    nodes_.push_back({});
  }

  // Adds module `name` (a view that outlives the tree); returns its index among the modules.
  int Add(std::string_view name) {
    if (auto it = modules_.find(name); it != modules_.end()) return it->second;
    int at = 0;
    for (size_t start = 0; start <= name.size();) {
      const size_t dot = std::min(name.find('.', start), name.size());
      at = Child(at, name.substr(0, dot), name.substr(start, dot - start));
      start = dot + 1;
    }
    const int index = static_cast<int>(modules_.size());
    modules_.emplace(name, index);
    nodes_[at].module = index;
    return index;
  }

  // The rank of each module (by Add's index) in execution order.
  std::vector<uint32_t> Ranks() {
    MarkMtpLayers();
    std::vector<int> main, last;
    Walk(0, false, &main, &last);
    std::vector<uint32_t> rank(modules_.size());
    uint32_t next = 0;
    for (const auto* list : {&main, &last}) {
      for (int m : *list) rank[m] = next++;
    }
    return rank;
  }

 private:
  struct Node {
    std::string_view prefix;  // the dotted name to here
    std::string_view part;    // its last component
    std::vector<int> children;
    int module = -1;          // the module this node is, if one
    bool mtp = false;
  };

  int Child(int parent, std::string_view prefix, std::string_view part) {
    auto [it, added] = by_prefix_.emplace(prefix, static_cast<int>(nodes_.size()));
    if (added) {
      nodes_.push_back({prefix, part, {}, -1, IsMtpComponent(part)});
      nodes_[parent].children.push_back(it->second);
    }
    return it->second;
  }

  // DeepSeek's MTP layers: layers past num_hidden_layers in the stack that holds them.
  void MarkMtpLayers() {
    const int mtp = config_.num_nextn_predict_layers;
    if (mtp <= 0 || !config_.num_hidden_layers) return;
    const uint64_t layers = static_cast<uint64_t>(*config_.num_hidden_layers);
    for (Node& node : nodes_) {
      size_t numbered = 0;
      for (int c : node.children) numbered += Number(nodes_[c].part).has_value();
      if (numbered != layers + static_cast<uint64_t>(mtp)) continue;
      for (int c : node.children) {
        if (auto n = Number(nodes_[c].part); n && *n >= layers) nodes_[c].mtp = true;
      }
    }
  }

  // A module's place in the model tree among its siblings (registration order), or -1.
  int32_t TreePlace(std::string_view prefix) const {
    if (model_ == nullptr) return -1;
    if (int32_t n = model_->FindNode(prefix); n >= 0) return model_->nodes[n].pre;
    if (int32_t t = model_->FindTensor(prefix); t >= 0) return model_->tensor_pre[t];
    return -1;
  }

  // Siblings by what the rules know of their names (role, then rank), then in the model tree's
  // registration order (diffusers registers up_blocks before mid_block, and conv_in before the
  // time embedding its forward calls first: the rules win), then by name.
  // Each child's key is found once (a table scan and two lookups in the model tree), not at
  // every comparison.
  void SortChildren(std::vector<int>& children) const {
    using Key = std::tuple<Role, int, bool, int32_t>;
    std::vector<std::pair<Key, int>> keyed;
    keyed.reserve(children.size());
    for (int c : children) {
      const int32_t place = TreePlace(nodes_[c].prefix);
      const auto [role, rank] = RoleOf(nodes_[c].part);
      keyed.push_back({Key(role, rank, place < 0, place), c});
    }
    std::sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first < b.first;
      return NaturalLess(nodes_[a.second].part, nodes_[b.second].part);
    });
    for (size_t i = 0; i < keyed.size(); ++i) children[i] = keyed[i].second;
  }

  void Walk(int node, bool mtp, std::vector<int>* main, std::vector<int>* last) {
    mtp = mtp || nodes_[node].mtp;
    if (nodes_[node].module >= 0) (mtp ? last : main)->push_back(nodes_[node].module);
    std::vector<int> children = nodes_[node].children;
    SortChildren(children);
    for (int c : children) Walk(c, mtp, main, last);
  }

  const ModelConfig& config_;
  const ModuleTree::Impl* model_;
  std::vector<Node> nodes_;  // nodes_[0]: the root
  std::unordered_map<std::string_view, int> by_prefix_;
  std::unordered_map<std::string_view, int> modules_;
};

// The longest of `prefixes` (by their index) that `name` is or is under; `none` when none.
size_t GivenOf(std::string_view name,
               const std::unordered_map<std::string_view, size_t>& prefixes, size_t none) {
  for (std::string_view at = name;;) {
    if (auto it = prefixes.find(at); it != prefixes.end()) return it->second;
    const size_t dot = at.rfind('.');
    if (dot == std::string_view::npos) return none;
    at = at.substr(0, dot);
  }
}

// The tensor indices by (given, rank, index), for a catalog in file order (FileOrdered), where
// index order is file order: two counting-sort passes, no comparison.
std::vector<size_t> SortByModule(const std::vector<size_t>& given, size_t given_kinds,
                                 const std::vector<uint32_t>& rank, size_t n) {
  const auto by = [n](const auto& key, size_t kinds, const std::vector<size_t>& in) {
    std::vector<size_t> start(kinds + 1, 0);
    for (size_t i : in) ++start[key[i] + 1];
    for (size_t k = 1; k <= kinds; ++k) start[k] += start[k - 1];
    std::vector<size_t> sorted(n);
    for (size_t i : in) sorted[start[key[i]]++] = i;
    return sorted;
  };
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  const size_t ranks = rank.empty() ? 1 : *std::max_element(rank.begin(), rank.end()) + 1;
  return by(given, given_kinds, by(rank, ranks, all));
}

// The same for any catalog: by (given, rank, file, offset, index), each key made once and the
// keys sorted side by side (not by index into the catalog, whose entries a comparison would
// then have to reach).
std::vector<size_t> SortByKey(const std::vector<size_t>& given, const std::vector<uint32_t>& rank,
                              const std::vector<TensorInfo>& infos) {
  std::vector<std::tuple<size_t, uint32_t, uint32_t, uint64_t, size_t>> keys(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    keys[i] = {given[i], rank[i], infos[i].file, infos[i].offset, i};
  }
  std::sort(keys.begin(), keys.end());
  std::vector<size_t> order(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) order[k] = std::get<4>(keys[k]);
  return order;
}

}  // namespace

bool FileOrdered(const std::vector<TensorInfo>& infos) {
  for (size_t i = 1; i < infos.size(); ++i) {
    if (std::tie(infos[i].file, infos[i].offset) < std::tie(infos[i - 1].file, infos[i - 1].offset)) {
      return false;
    }
  }
  return true;
}

bool NaturalLess(std::string_view a, std::string_view b) {
  while (!a.empty() && !b.empty()) {
    const size_t ea = std::min(a.find('.'), a.size()), eb = std::min(b.find('.'), b.size());
    const std::string_view ca = a.substr(0, ea), cb = b.substr(0, eb);
    const std::optional<uint64_t> na = Number(ca), nb = Number(cb);
    if (na && nb && *na != *nb) return *na < *nb;
    if (na.has_value() != nb.has_value()) return na.has_value();
    if (ca != cb) return ca < cb;
    a.remove_prefix(std::min(ea + 1, a.size()));
    b.remove_prefix(std::min(eb + 1, b.size()));
  }
  return a.size() < b.size();
}

std::string_view OrderModuleOf(std::string_view name) {
  size_t parent = 0;  // the end of the components before the last
  for (size_t start = 0; start < name.size();) {
    const size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) break;
    const std::string_view part = name.substr(start, dot - start);
    if (Number(part) || IsOneModule(part)) return name.substr(0, dot);
    parent = dot;
    start = dot + 1;
  }
  return parent == 0 ? name : name.substr(0, parent);
}

Result<TensorOrdering> OrderTensors(const Checkpoint& checkpoint, const PlanOptions& options) {
  const auto& infos = checkpoint.tensors();
  TensorOrdering out;
  out.module.resize(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) out.module[i] = OrderModuleOf(infos[i].name);
  const bool by_file = options.order == TensorOrder::kFile;
  std::vector<uint32_t> rank(infos.size());  // each tensor's module's place in execution order
  if (!by_file) {  // file order needs no module tree
    OrderTree tree(checkpoint.config(), options.model ? &*options.model : nullptr);
    std::vector<int> module_index(infos.size());
    for (size_t i = 0; i < infos.size(); ++i) module_index[i] = tree.Add(out.module[i]);
    const std::vector<uint32_t> ranks = tree.Ranks();
    for (size_t i = 0; i < infos.size(); ++i) rank[i] = ranks[module_index[i]];
  }
  // Given prefixes go first: each tensor's, or none (after them).
  std::vector<size_t> given(infos.size(), 0);
  if (options.order == TensorOrder::kGiven) {
    if (options.order_prefixes.empty()) {
      return Status::InvalidArgument("the given order lists no module: give at least one prefix");
    }
    std::unordered_map<std::string_view, size_t> prefixes;
    for (size_t p = 0; p < options.order_prefixes.size(); ++p) {
      if (options.order_prefixes[p].empty()) {
        return Status::InvalidArgument(fmt::format(
            "prefix {} of the given order is empty: name a module or a tensor", p + 1));
      }
      prefixes.emplace(options.order_prefixes[p], p);
    }
    std::vector<bool> used(options.order_prefixes.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      given[i] = GivenOf(infos[i].name, prefixes, options.order_prefixes.size());
      if (given[i] == options.order_prefixes.size()) continue;
      used[given[i]] = true;
      out.module[i] = options.order_prefixes[given[i]];
    }
    for (size_t p = 0; p < used.size(); ++p) {
      if (used[p]) continue;
      return Status::InvalidArgument(fmt::format(
          "prefix '{}' of the given order names no tensor of the checkpoint (a module's tensors "
          "are named '{}.…'); list modules of this model",
          options.order_prefixes[p], options.order_prefixes[p]));
    }
  }
  const size_t kinds = options.order_prefixes.size() + 1;  // given: a prefix's index, or none
  out.order = FileOrdered(infos) ? SortByModule(given, kinds, rank, infos.size())
                                 : SortByKey(given, rank, infos);
  return out;
}

void CutModules(const std::vector<std::string_view>& module_of_source, LoadPlan* plan) {
  plan->modules.clear();
  for (uint32_t t = 0; t < plan->tensors.size(); ++t) {
    const std::string_view module = module_of_source[plan->tensors[t].source];
    if (plan->modules.empty() || plan->modules.back().prefix != module) {
      plan->modules.push_back({std::string(module), t, t});
    }
    plan->modules.back().end = t + 1;
  }
}

}  // namespace loadstone::planning

namespace loadstone {

std::string_view TensorOrderName(TensorOrder order) {
  switch (order) {
    case TensorOrder::kExecution: return "execution";
    case TensorOrder::kFile: return "file";
    case TensorOrder::kGiven: return "given";
  }
  return "?";
}

}  // namespace loadstone
