// ModuleTree: the tree's bookkeeping and the tree of a checkpoint (every tensor a parameter).
#include "runtime/device_map/module_tree.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include <fmt/format.h>

namespace loadstone {
namespace {

void SplitDots(std::string_view name, std::vector<std::string_view>* parts) {
  parts->clear();
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    parts->push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return;
    start = dot + 1;
  }
}

std::string_view LocalName(std::string_view name) {
  size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A key whose byte order is the natural order of dotted names: component by component, numbers
// (as numbers) before words.
std::string NaturalKey(std::string_view name) {
  std::string key;
  key.reserve(name.size() + 8);
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    std::string_view c = name.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (start > 0) key += '\0';
    if (AllDigits(c)) {
      std::string_view digits = c;
      while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
      key += '\x01';
      key += static_cast<char>(std::min<size_t>(digits.size(), 255));
      key += digits;
      key += '\x03';  // then the spelling, so "01" and "1" stay apart
    } else {
      key += '\x02';
    }
    key += c;
    if (dot == std::string_view::npos) return key;
    start = dot + 1;
  }
}

}  // namespace

}  // namespace loadstone

namespace loadstone::device_map {

std::string_view NameArena::Add(std::string_view text) {
  constexpr size_t kBlock = 64 * 1024;
  if (text.size() > left_) {
    const size_t size = std::max(kBlock, text.size());
    blocks_.push_back(std::make_unique<char[]>(size));
    next_ = blocks_.back().get();
    left_ = size;
  }
  if (!text.empty()) std::memcpy(next_, text.data(), text.size());
  std::string_view out(next_, text.size());
  next_ += text.size();
  left_ -= text.size();
  return out;
}

}  // namespace loadstone::device_map

namespace loadstone {

Result<std::string_view> ModuleTree::Impl::ChildName(int32_t node, std::string_view local,
                                                     std::string_view what) {
  const std::string_view parent = nodes[static_cast<size_t>(node)].name;
  const size_t size = parent.empty() ? local.size() : parent.size() + 1 + local.size();
  size_t depth = 1;
  for (int32_t n = node; n > 0; n = nodes[static_cast<size_t>(n)].parent) ++depth;
  if (size > device_map::kMaxNameBytes || depth > device_map::kMaxNameDepth) {
    return Status::InvalidArgument(fmt::format(
        "{}: its full name has {} bytes in {} dotted components, more than the planner takes "
        "({} bytes, {} components)",
        what, size, depth, device_map::kMaxNameBytes, device_map::kMaxNameDepth));
  }
  if (parent.empty()) return names.Add(local);
  std::string full;
  full.reserve(size);
  full.append(parent).append(".").append(local);
  return names.Add(full);
}

int32_t ModuleTree::Impl::AddNode(int32_t parent, std::string_view full_name,
                                  std::string class_name) {
  device_map::TreeNode node;
  node.parent = parent;
  node.class_name = std::move(class_name);
  node.name = full_name;
  auto id = static_cast<int32_t>(nodes.size());
  nodes.push_back(std::move(node));
  if (parent >= 0) nodes[static_cast<size_t>(parent)].children.push_back(id);
  return id;
}

int32_t ModuleTree::Impl::AddTensor(int32_t node, std::string_view full_name, int32_t storage,
                                    bool is_buffer, bool persistent) {
  device_map::TreeTensor tensor;
  tensor.name = full_name;
  tensor.node = node;
  tensor.storage = storage;
  tensor.is_buffer = is_buffer;
  tensor.persistent = persistent;
  auto id = static_cast<int32_t>(tensors.size());
  tensors.push_back(tensor);
  auto& owner = nodes[static_cast<size_t>(node)];
  (is_buffer ? owner.buffers : owner.params).push_back(id);
  if (indexed) tensor_by_name.emplace(full_name, id);
  return id;
}

void ModuleTree::Impl::Finish() {
  tensor_pre.assign(tensors.size(), 0);
  nodes_by_pre.clear();
  nodes_by_pre.reserve(nodes.size());
  int32_t counter = 0;
  // Iterative pre-order: (node, stage) where stage 0 = enter, 1 = leave.
  std::vector<std::pair<int32_t, int>> stack = {{0, 0}};
  while (!stack.empty()) {
    auto [id, stage] = stack.back();
    stack.pop_back();
    device_map::TreeNode& node = nodes[static_cast<size_t>(id)];
    if (stage == 1) {
      for (int32_t t : node.buffers) tensor_pre[static_cast<size_t>(t)] = counter++;
      node.end = counter;
      continue;
    }
    node.pre = counter++;
    nodes_by_pre.push_back(id);
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
  indexed = true;
}

std::vector<int32_t> ModuleTree::Impl::SizedTensors() const {
  const std::vector<int32_t>& order = nodes_by_pre;
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
  auto it = node_by_name.find(name);
  return it == node_by_name.end() ? -1 : it->second;
}

int32_t ModuleTree::Impl::FindTensor(std::string_view name) const {
  auto it = tensor_by_name.find(name);
  return it == tensor_by_name.end() ? -1 : it->second;
}

bool ModuleTree::has_classes() const { return impl_->has_classes; }
size_t ModuleTree::num_modules() const { return impl_->nodes.size(); }
size_t ModuleTree::num_tensors() const { return impl_->tensors.size(); }

std::vector<std::string> ModuleTree::StateDictNames() const {
  std::vector<std::string> names;
  std::vector<int32_t> stack = {0};
  while (!stack.empty()) {
    const device_map::TreeNode& node = impl_->nodes[static_cast<size_t>(stack.back())];
    stack.pop_back();
    for (int32_t t : node.params) names.emplace_back(impl_->tensors[static_cast<size_t>(t)].name);
    for (int32_t t : node.buffers) {
      const device_map::TreeTensor& tensor = impl_->tensors[static_cast<size_t>(t)];
      if (tensor.persistent) names.emplace_back(tensor.name);
    }
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) stack.push_back(*it);
  }
  return names;
}

namespace {

// InvalidArgument for a name the planner does not take (an empty component; too long or deep).
Status CheckTensorName(const TensorInfo& info, const std::vector<std::string_view>& parts) {
  if (std::any_of(parts.begin(), parts.end(), [](std::string_view p) { return p.empty(); })) {
    return Status::InvalidArgument(
        fmt::format("tensor name '{}' has an empty dotted component", info.name));
  }
  if (info.name.size() > device_map::kMaxNameBytes || parts.size() > device_map::kMaxNameDepth) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' has a name of {} bytes in {} dotted components, more than the device-map "
        "planner takes ({} bytes, {} components); load it onto one device (--device-map cpu "
        "or cuda:N) or with an explicit map",
        info.name.substr(0, 64) + (info.name.size() > 64 ? "..." : ""), info.name.size(),
        parts.size(), device_map::kMaxNameBytes, device_map::kMaxNameDepth));
  }
  return Status::OK();
}

// Shard order first: children and parameters by the first (file, natural rank) below them.
void OrderByShard(const std::vector<std::pair<uint32_t, uint32_t>>& tensor_rank,
                  ModuleTree::Impl* impl) {
  std::vector<std::pair<uint32_t, uint32_t>> first(impl->nodes.size(), {UINT32_MAX, UINT32_MAX});
  for (size_t t = 0; t < impl->tensors.size(); ++t) {
    auto& f = first[static_cast<size_t>(impl->tensors[t].node)];
    f = std::min(f, tensor_rank[t]);
  }
  for (size_t n = impl->nodes.size(); n-- > 1;) {  // children were created after parents
    auto& f = first[static_cast<size_t>(impl->nodes[n].parent)];
    f = std::min(f, first[n]);
  }
  for (device_map::TreeNode& node : impl->nodes) {
    std::stable_sort(node.children.begin(), node.children.end(), [&](int32_t a, int32_t b) {
      return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)];
    });
    std::stable_sort(node.params.begin(), node.params.end(), [&](int32_t a, int32_t b) {
      return tensor_rank[static_cast<size_t>(a)] < tensor_rank[static_cast<size_t>(b)];
    });
  }
}

// The indices of the tensors that are parameters, in the natural order of their names. A
// quantized weight's quant-state tensors ("W.absmax", "M.SCB", ...) are not parameters of the
// model (accelerate sizes a bitsandbytes layer by its packed weight alone): they are left out
// of the tree and go wherever their weight's map entry, a dotted prefix of theirs, sends it.
std::vector<size_t> ParametersInNaturalOrder(const std::vector<TensorInfo>& infos) {
  std::unordered_set<std::string_view> companions;
  for (const TensorInfo& t : infos) {
    if (t.packed) companions.insert(t.packed->companions().begin(), t.packed->companions().end());
  }
  std::vector<size_t> order;
  order.reserve(infos.size());
  std::vector<std::string> keys(infos.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    if (companions.contains(infos[i].name)) continue;
    keys[i] = NaturalKey(infos[i].name);
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  return order;
}

// InvalidArgument naming the first tensor (in the finished tree's order) whose name is also a
// module's.
Status CheckNoTensorIsModule(const ModuleTree::Impl& impl) {
  for (const device_map::TreeTensor& tensor : impl.tensors) {
    if (impl.node_by_name.contains(tensor.name)) {
      return Status::InvalidArgument(fmt::format(
          "'{}' is both a tensor and a module prefix of other tensors", tensor.name));
    }
  }
  return Status::OK();
}

}  // namespace

Result<ModuleTree> ModuleTree::FromCheckpoint(const Checkpoint& checkpoint) {
  const std::vector<TensorInfo>& infos = checkpoint.tensors();
  // Natural order makes every module's tensors contiguous, so the tree is built with a stack.
  const std::vector<size_t> order = ParametersInNaturalOrder(infos);
  auto impl = std::make_shared<Impl>();
  impl->AddNode(-1, std::string_view(), "");
  impl->storages.reserve(infos.size());
  impl->tensors.reserve(infos.size());
  std::vector<int32_t> path = {0};  // path[d] = the module at depth d
  std::vector<std::string_view> parts;
  std::vector<std::pair<uint32_t, uint32_t>> tensor_rank;  // (file, natural rank) per tensor
  tensor_rank.reserve(infos.size());
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const TensorInfo& info = infos[order[rank]];
    SplitDots(info.name, &parts);
    LOADSTONE_RETURN_IF_ERROR(CheckTensorName(info, parts));
    // One copy of the name; the modules on its path are views of its prefixes.
    const std::string_view full = impl->names.Add(info.name);
    size_t depth = 0;  // how much of `path` (below the root) matches the name's modules
    while (depth + 1 < path.size() && depth + 1 < parts.size() &&
           LocalName(impl->nodes[static_cast<size_t>(path[depth + 1])].name) == parts[depth]) {
      ++depth;
    }
    path.resize(depth + 1);
    for (; depth + 1 < parts.size(); ++depth) {
      const size_t end = static_cast<size_t>(parts[depth].data() + parts[depth].size() -
                                             info.name.data());
      path.push_back(impl->AddNode(path[depth], full.substr(0, end), ""));
    }
    device_map::Storage storage;
    storage.numel = info.numel();
    storage.type.dtype = info.dtype;
    impl->storages.push_back(storage);
    impl->AddTensor(path.back(), full, static_cast<int32_t>(impl->storages.size() - 1),
                    /*is_buffer=*/false, /*persistent=*/true);
    tensor_rank.push_back({info.file, static_cast<uint32_t>(rank)});
  }
  if (checkpoint.files().size() > 1) OrderByShard(tensor_rank, impl.get());
  impl->Finish();
  LOADSTONE_RETURN_IF_ERROR(CheckNoTensorIsModule(*impl));
  return ModuleTreeAccess::Make(std::move(impl));
}

}  // namespace loadstone
