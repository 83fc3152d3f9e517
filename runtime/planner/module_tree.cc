// ModuleTree: the tree's bookkeeping and the tree of a checkpoint (every tensor a parameter).
#include "runtime/planner/module_tree.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace loadstone {
namespace {

std::vector<std::string_view> SplitDots(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// One dotted component before another: numbers as numbers, and before words.
bool ComponentLess(std::string_view a, std::string_view b) {
  bool na = AllDigits(a);
  bool nb = AllDigits(b);
  if (na != nb) return na;
  if (na) {
    while (a.size() > 1 && a.front() == '0') a.remove_prefix(1);
    while (b.size() > 1 && b.front() == '0') b.remove_prefix(1);
    if (a.size() != b.size()) return a.size() < b.size();
  }
  return a < b;
}

bool NaturalLess(const std::vector<std::string_view>& a, const std::vector<std::string_view>& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), ComponentLess);
}

}  // namespace

int32_t ModuleTree::Impl::AddNode(int32_t parent, std::string_view local, std::string class_name) {
  planner::TreeNode node;
  node.parent = parent;
  node.class_name = std::move(class_name);
  if (parent >= 0) {
    const std::string& parent_name = nodes[static_cast<size_t>(parent)].name;
    node.name = parent_name.empty() ? std::string(local) : parent_name + "." + std::string(local);
  }
  auto id = static_cast<int32_t>(nodes.size());
  nodes.push_back(std::move(node));
  if (parent >= 0) nodes[static_cast<size_t>(parent)].children.push_back(id);
  return id;
}

int32_t ModuleTree::Impl::AddTensor(int32_t node, std::string_view local, int32_t storage,
                                    bool is_buffer, bool persistent) {
  planner::TreeTensor tensor;
  const std::string& module_name = nodes[static_cast<size_t>(node)].name;
  tensor.name = module_name.empty() ? std::string(local) : module_name + "." + std::string(local);
  tensor.node = node;
  tensor.storage = storage;
  tensor.is_buffer = is_buffer;
  tensor.persistent = persistent;
  auto id = static_cast<int32_t>(tensors.size());
  tensors.push_back(std::move(tensor));
  auto& owner = nodes[static_cast<size_t>(node)];
  (is_buffer ? owner.buffers : owner.params).push_back(id);
  return id;
}

void ModuleTree::Impl::Finish() {
  tensor_pre.assign(tensors.size(), 0);
  int32_t counter = 0;
  // Iterative pre-order: (node, stage) where stage 0 = enter, 1 = leave.
  std::vector<std::pair<int32_t, int>> stack = {{0, 0}};
  while (!stack.empty()) {
    auto [id, stage] = stack.back();
    stack.pop_back();
    planner::TreeNode& node = nodes[static_cast<size_t>(id)];
    if (stage == 1) {
      for (int32_t t : node.buffers) tensor_pre[static_cast<size_t>(t)] = counter++;
      node.end = counter;
      continue;
    }
    node.pre = counter++;
    for (int32_t t : node.params) tensor_pre[static_cast<size_t>(t)] = counter++;
    stack.push_back({id, 1});
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) stack.push_back({*it, 0});
  }
  node_by_name.clear();
  tensor_by_name.clear();
  node_by_name.reserve(nodes.size());
  tensor_by_name.reserve(tensors.size());
  for (size_t i = 0; i < nodes.size(); ++i) node_by_name.emplace(nodes[i].name, static_cast<int32_t>(i));
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensor_by_name.emplace(tensors[i].name, static_cast<int32_t>(i));
  }
}

std::vector<int32_t> ModuleTree::Impl::SizedTensors() const {
  std::vector<int32_t> order(nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return nodes[static_cast<size_t>(a)].pre < nodes[static_cast<size_t>(b)].pre;
  });
  std::vector<int32_t> out;
  out.reserve(tensors.size());
  std::vector<bool> seen(storages.size(), false);
  for (int32_t id : order) {
    for (int32_t t : nodes[static_cast<size_t>(id)].params) {
      auto storage = static_cast<size_t>(tensors[static_cast<size_t>(t)].storage);
      if (seen[storage]) continue;
      seen[storage] = true;
      out.push_back(t);
    }
  }
  for (int32_t id : order) {
    for (int32_t t : nodes[static_cast<size_t>(id)].buffers) out.push_back(t);
  }
  return out;
}

int32_t ModuleTree::Impl::FindNode(std::string_view name) const {
  auto it = node_by_name.find(std::string(name));
  return it == node_by_name.end() ? -1 : it->second;
}

int32_t ModuleTree::Impl::FindTensor(std::string_view name) const {
  auto it = tensor_by_name.find(std::string(name));
  return it == tensor_by_name.end() ? -1 : it->second;
}

bool ModuleTree::has_classes() const { return impl_->has_classes; }
size_t ModuleTree::num_modules() const { return impl_->nodes.size(); }
size_t ModuleTree::num_tensors() const { return impl_->tensors.size(); }

std::vector<std::string> ModuleTree::StateDictNames() const {
  std::vector<std::string> names;
  std::vector<int32_t> stack = {0};
  while (!stack.empty()) {
    const planner::TreeNode& node = impl_->nodes[static_cast<size_t>(stack.back())];
    stack.pop_back();
    for (int32_t t : node.params) names.push_back(impl_->tensors[static_cast<size_t>(t)].name);
    for (int32_t t : node.buffers) {
      const planner::TreeTensor& tensor = impl_->tensors[static_cast<size_t>(t)];
      if (tensor.persistent) names.push_back(tensor.name);
    }
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) stack.push_back(*it);
  }
  return names;
}

Result<ModuleTree> ModuleTree::FromCheckpoint(const Checkpoint& checkpoint) {
  const std::vector<TensorInfo>& infos = checkpoint.tensors();
  std::vector<std::vector<std::string_view>> split(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) split[i] = SplitDots(infos[i].name);
  std::vector<size_t> order(infos.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (infos[a].file != infos[b].file) return infos[a].file < infos[b].file;
    return NaturalLess(split[a], split[b]);
  });
  auto impl = std::make_shared<Impl>();
  impl->AddNode(-1, "", "");
  std::unordered_map<std::string, int32_t> node_ids = {{"", 0}};
  for (size_t index : order) {
    const TensorInfo& info = infos[index];
    const std::vector<std::string_view>& parts = split[index];
    if (std::any_of(parts.begin(), parts.end(), [](std::string_view p) { return p.empty(); })) {
      return Status::InvalidArgument(
          fmt::format("tensor name '{}' has an empty dotted component", info.name));
    }
    int32_t node = 0;
    std::string prefix;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!prefix.empty()) prefix += '.';
      prefix += parts[i];
      auto [it, inserted] = node_ids.emplace(prefix, 0);
      if (inserted) it->second = impl->AddNode(node, parts[i], "");
      node = it->second;
    }
    planner::Storage storage;
    storage.numel = info.numel();
    storage.type.dtype = info.dtype;
    impl->storages.push_back(storage);
    impl->AddTensor(node, parts.back(), static_cast<int32_t>(impl->storages.size() - 1),
                    /*is_buffer=*/false, /*persistent=*/true);
  }
  impl->Finish();
  for (const planner::TreeTensor& tensor : impl->tensors) {
    if (impl->node_by_name.contains(tensor.name)) {
      return Status::InvalidArgument(fmt::format(
          "'{}' is both a tensor and a module prefix of other tensors", tensor.name));
    }
  }
  return ModuleTree(std::move(impl));
}

}  // namespace loadstone
