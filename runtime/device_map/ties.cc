// Tied parameters in placement (find_tied_parameters, get_module_size_with_ties) and
// fallback_allocate.
#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "runtime/device_map/greedy.h"

namespace loadstone::device_map {

std::string PyListRepr(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += "'" + items[i] + "'";
  }
  return out + "]";
}

std::vector<std::vector<std::string>> FindTiedGroups(const ModuleTree::Impl& tree) {
  std::vector<int32_t> aliases(tree.storages.size(), 0);
  for (const TreeTensor& t : tree.tensors) {
    if (!t.is_buffer) ++aliases[static_cast<size_t>(t.storage)];
  }
  std::vector<std::vector<std::string>> by_storage(tree.storages.size());
  for (const TreeTensor& t : tree.tensors) {
    if (!t.is_buffer && aliases[static_cast<size_t>(t.storage)] > 1) {
      by_storage[static_cast<size_t>(t.storage)].emplace_back(t.name);
    }
  }
  std::vector<std::vector<std::string>> groups;
  for (int32_t t : tree.SizedTensors()) {
    const TreeTensor& tensor = tree.tensors[static_cast<size_t>(t)];
    if (tensor.is_buffer) continue;
    std::vector<std::string>& names = by_storage[static_cast<size_t>(tensor.storage)];
    if (names.size() < 2) continue;
    std::sort(names.begin(), names.end());
    groups.push_back(std::move(names));
  }
  return groups;
}

namespace {

// A polynomial hash of `text` with its length mixed in. Suffix hashes of one string come out of
// one backward pass (SuffixHashes) equal to this function of each suffix.
constexpr uint64_t kHashBase = 0x100000001b3ULL;

uint64_t Mix(uint64_t h, size_t length) { return h ^ (length * 0x9e3779b97f4a7c15ULL); }

uint64_t HashOf(std::string_view text) {
  uint64_t h = 0;
  for (char c : text) h = h * kHashBase + static_cast<unsigned char>(c);
  return Mix(h, text.size());
}

void AddGroup(std::unordered_map<uint64_t, std::vector<uint32_t>>* map, uint64_t key, uint32_t g) {
  std::vector<uint32_t>& groups = (*map)[key];
  if (groups.empty() || groups.back() != g) groups.push_back(g);
}

template <typename F>
void ForEachComponent(std::string_view name, F&& f) {
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    f(name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return;
    start = dot + 1;
  }
}

}  // namespace

TieIndex::TieIndex(const std::vector<std::vector<std::string>>& groups) {
  for (uint32_t g = 0; g < groups.size(); ++g) {
    for (const std::string& k : groups[g]) {
      ForEachComponent(k, [&](std::string_view component) {
        AddGroup(&whole_, HashOf(component), g);
        uint64_t h = 0, power = 1;
        for (size_t i = component.size(); i-- > 0;) {  // component[i..]: c[i]·B^(n-1-i) + ...
          h += static_cast<unsigned char>(component[i]) * power;
          power *= kHashBase;
          AddGroup(&suffixes_, Mix(h, component.size() - i), g);
        }
      });
    }
  }
}

const std::vector<uint32_t>& TieIndex::Candidates(std::string_view name) const {
  // If name + "." lies in k + ".", every component of `name` but the first is a whole component
  // of k, and the first is a suffix of one: the shortest of those groups lists holds them all.
  static const std::vector<uint32_t> kNone;
  const std::vector<uint32_t>* best = nullptr;
  bool first = true;
  ForEachComponent(name, [&](std::string_view component) {
    const auto& map = first ? suffixes_ : whole_;
    first = false;
    auto it = map.find(HashOf(component));
    const std::vector<uint32_t>* groups = it == map.end() ? &kNone : &it->second;
    if (best == nullptr || groups->size() < best->size()) best = groups;
  });
  return best ? *best : kNone;
}

// The reference: `name + "." in k + "."` (substring), without building either string.
bool TieContains(const PlanContext& ctx, std::string_view name, std::string_view k) {
  auto followed_by_dot = [&](size_t at) {
    const size_t end = at + name.size();
    return end == k.size() || k[end] == '.';
  };
  if (ctx.fixes.prefix_tie_test) return k.substr(0, name.size()) == name && followed_by_dot(0);
  for (size_t at = k.find(name); at != std::string_view::npos; at = k.find(name, at + 1)) {
    if (followed_by_dot(at)) return true;
  }
  return false;
}

std::vector<std::string> TiedParamsOutside(const PlanContext& ctx, const std::string& name,
                                           std::vector<std::vector<std::string>>* groups) {
  std::vector<std::string> params;
  for (uint32_t g : ctx.tie_index.Candidates(name)) {
    const std::vector<std::string>& group = ctx.tied_groups[g];
    bool any = false;
    bool all = true;
    for (const std::string& k : group) {
      bool inside = TieContains(ctx, name, k);
      any = any || inside;
      all = all && inside;
    }
    if (!any || all) continue;
    if (groups) groups->push_back(group);
    for (const std::string& p : group) {
      if (!TieContains(ctx, name, p)) params.push_back(p);
    }
  }
  return params;
}

PyNum SizeWithTies(const PlanContext& ctx, const std::vector<std::string>& tied_params,
                   PyNum module_size, const Todo& todo, std::vector<ptrdiff_t>* modules) {
  modules->clear();
  if (tied_params.empty()) return module_size;
  // accelerate takes the first entry of `todo` whose name + "." starts the parameter. For a few
  // parameters, a scan of `todo` each; for many (a large tied group), each dotted prefix of the
  // parameter is probed in an index of `todo` instead, where scans would be quadratic.
  auto starts = [](const std::string& p, const std::string& n) {
    return p.size() > n.size() && p.compare(0, n.size(), n) == 0 && p[n.size()] == '.';
  };
  constexpr size_t kScanAtMost = 16;
  std::unordered_map<std::string_view, size_t> first;
  if (tied_params.size() > kScanAtMost) {
    first.reserve(todo.size());
    for (size_t i = 0; i < todo.size(); ++i) first.emplace(todo[i].name, i);
  }
  for (const std::string& p : tied_params) {
    ptrdiff_t found = -1;
    if (tied_params.size() <= kScanAtMost) {
      for (size_t i = 0; i < todo.size() && found < 0; ++i) {
        if (starts(p, todo[i].name)) found = static_cast<ptrdiff_t>(i);
      }
    } else {
      for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1)) {
        auto it = first.find(std::string_view(p).substr(0, dot));
        if (it != first.end() && (found < 0 || it->second < static_cast<size_t>(found))) {
          found = static_cast<ptrdiff_t>(it->second);
        }
      }
    }
    modules->push_back(found);
  }
  PyNum total = module_size;
  for (size_t k = 0; k < tied_params.size(); ++k) {
    ptrdiff_t i = (*modules)[k];
    if (i < 0) continue;
    const Entry& e = todo[static_cast<size_t>(i)];
    PyNum tied_module_size = e.is_module() ? ctx.sizes->node[static_cast<size_t>(e.node)]
                                           : ctx.sizes->tensor[static_cast<size_t>(e.tensor)];
    total += tied_module_size - ctx.sizes->Of(*ctx.tree, tied_params[k]);
  }
  return total;
}

namespace {

ptrdiff_t IndexOf(const Todo& todo, const std::string& name) {
  for (size_t i = 0; i < todo.size(); ++i) {
    if (todo[i].name == name) return static_cast<ptrdiff_t>(i);
  }
  return -1;
}

}  // namespace

bool FallbackAllocate(const PlanContext& ctx, Todo* todo, PyNum size_limit, Entry* found) {
  if (size_limit < PyNum::Int(0)) return false;  // convert_file_size_to_int refuses it
  const ModuleTree::Impl& tree = *ctx.tree;
  bool with_buffers = ctx.fixes.requeue_split_buffers;
  Todo search = *todo;
  bool ok = false;
  Entry entry;
  std::vector<ptrdiff_t> tied_modules;
  while (!search.empty()) {
    entry = std::move(search.front());
    search.pop_front();
    std::vector<std::string> tied = TiedParamsOutside(ctx, entry.name, nullptr);
    PyNum own = entry.is_module() ? ctx.sizes->node[static_cast<size_t>(entry.node)]
                                  : ctx.sizes->tensor[static_cast<size_t>(entry.tensor)];
    if (SizeWithTies(ctx, tied, own, search, &tied_modules) <= size_limit) {
      ok = true;
      break;
    }
    if (!entry.is_module()) continue;
    const TreeNode& node = tree.nodes[static_cast<size_t>(entry.node)];
    if (node.children.empty() || ctx.no_split->Contains(entry.node)) continue;
    std::vector<Entry> children = ExpandModule(tree, entry.node, with_buffers);
    search.insert(search.begin(), children.begin(), children.end());
  }
  if (!ok) return false;
  // Expand the found entry's ancestors that are still whole in the list, then take it out.
  for (size_t dot = entry.name.find('.'); dot != std::string::npos;
       dot = entry.name.find('.', dot + 1)) {
    ptrdiff_t i = IndexOf(*todo, entry.name.substr(0, dot));
    if (i < 0) continue;
    Entry parent = (*todo)[static_cast<size_t>(i)];
    std::vector<Entry> children =
        parent.is_module() ? ExpandModule(tree, parent.node, with_buffers) : std::vector<Entry>{};
    todo->erase(todo->begin() + i);
    todo->insert(todo->begin() + i, children.begin(), children.end());
  }
  ptrdiff_t target = IndexOf(*todo, entry.name);
  if (target < 0) return false;
  *found = (*todo)[static_cast<size_t>(target)];
  todo->erase(todo->begin() + target);
  return true;
}

}  // namespace loadstone::device_map
