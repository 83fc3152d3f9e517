// Tied parameters in placement (find_tied_parameters, get_module_size_with_ties) and
// fallback_allocate.
#include <algorithm>

#include "runtime/planner/greedy.h"

namespace loadstone::planner {

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
      by_storage[static_cast<size_t>(t.storage)].push_back(t.name);
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

bool TieContains(const PlanContext& ctx, const std::string& name, const std::string& k) {
  std::string needle = name + ".";
  std::string hay = k + ".";
  if (ctx.fixes.prefix_tie_test) return hay.compare(0, needle.size(), needle) == 0;
  return hay.find(needle) != std::string::npos;
}

std::vector<std::string> TiedParamsOutside(const PlanContext& ctx, const std::string& name,
                                           std::vector<std::vector<std::string>>* groups) {
  std::vector<std::string> params;
  for (const std::vector<std::string>& group : ctx.tied_groups) {
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
  for (const std::string& p : tied_params) {
    ptrdiff_t found = -1;
    for (size_t i = 0; i < todo.size(); ++i) {
      const std::string& n = todo[i].name;
      if (p.size() > n.size() && p.compare(0, n.size(), n) == 0 && p[n.size()] == '.') {
        found = static_cast<ptrdiff_t>(i);
        break;
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

}  // namespace loadstone::planner
