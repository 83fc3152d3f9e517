#include "runtime/device_map/min_max.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include <fmt/format.h>

namespace loadstone::device_map {
namespace {

// Sizes in eighths of a byte: exact for every element size (bool is 1/8).
int64_t Eighths(PyNum n) {
  double v = n.AsDouble() * 8.0;
  if (!(v > 0)) return 0;
  if (v >= 9.2e18) return INT64_MAX / 4;
  return std::llround(v);
}

// How many leading elements fit when each part i takes at most caps[i] (greedy filling is
// optimal for the longest prefix of contiguous parts).
size_t LongestPrefix(const std::vector<int64_t>& sizes, const std::vector<int64_t>& caps,
                     std::vector<size_t>* counts) {
  size_t next = 0;
  if (counts) counts->assign(caps.size(), 0);
  for (size_t part = 0; part < caps.size(); ++part) {
    int64_t load = 0;
    while (next < sizes.size() && load + sizes[next] <= caps[part]) {
      load += sizes[next++];
      if (counts) ++(*counts)[part];
    }
  }
  return next;
}

struct Group {
  std::vector<Entry> atoms;
  int64_t size = 0;
};

// The atoms of the layer sequence, in placement order.
std::vector<Entry> Atoms(const PlanContext& ctx) {
  const ModuleTree::Impl& tree = *ctx.tree;
  std::vector<Entry> atoms;
  Todo todo = InitialTodo(tree);
  while (!todo.empty()) {
    Entry e = std::move(todo.front());
    todo.pop_front();
    if (!e.is_module() || tree.nodes[static_cast<size_t>(e.node)].children.empty() ||
        ctx.no_split->Contains(e.node)) {
      atoms.push_back(std::move(e));
      continue;
    }
    std::vector<Entry> children = ExpandModule(tree, e.node, /*with_buffers=*/true);
    todo.insert(todo.begin(), children.begin(), children.end());
  }
  return atoms;
}

// Atoms sharing a tied storage join the group of the first of them.
std::vector<Group> Groups(const PlanContext& ctx, const std::vector<Entry>& atoms) {
  const ModuleTree::Impl& tree = *ctx.tree;
  std::vector<std::pair<int32_t, int32_t>> ranges;  // pre-order range per atom (sorted)
  for (const Entry& a : atoms) {
    if (a.is_module()) {
      const TreeNode& n = tree.nodes[static_cast<size_t>(a.node)];
      ranges.push_back({n.pre, n.end});
    } else {
      int32_t pre = tree.tensor_pre[static_cast<size_t>(a.tensor)];
      ranges.push_back({pre, pre + 1});
    }
  }
  std::vector<size_t> by_pre(atoms.size());
  std::iota(by_pre.begin(), by_pre.end(), size_t{0});
  std::sort(by_pre.begin(), by_pre.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  auto atom_of = [&](int32_t pre) -> ptrdiff_t {
    auto it = std::upper_bound(by_pre.begin(), by_pre.end(), pre,
                               [&](int32_t p, size_t a) { return p < ranges[a].first; });
    if (it == by_pre.begin()) return -1;
    size_t a = *(it - 1);
    return pre < ranges[a].second ? static_cast<ptrdiff_t>(a) : -1;
  };
  std::vector<size_t> leader(atoms.size());
  std::iota(leader.begin(), leader.end(), size_t{0});
  std::vector<ptrdiff_t> first_atom(tree.storages.size(), -1);
  std::vector<std::pair<size_t, size_t>> ties;  // (earlier atom, later atom)
  for (size_t t = 0; t < tree.tensors.size(); ++t) {
    ptrdiff_t a = atom_of(tree.tensor_pre[t]);
    if (a < 0) continue;
    auto storage = static_cast<size_t>(tree.tensors[t].storage);
    if (first_atom[storage] < 0) {
      first_atom[storage] = a;
    } else if (a != first_atom[storage]) {
      ties.push_back({static_cast<size_t>(first_atom[storage]), static_cast<size_t>(a)});
    }
  }
  std::function<size_t(size_t)> find = [&](size_t x) {
    return leader[x] == x ? x : leader[x] = find(leader[x]);
  };
  for (auto [a, b] : ties) {
    size_t ra = find(a), rb = find(b);
    if (ra != rb) leader[std::max(ra, rb)] = std::min(ra, rb);
  }
  std::vector<Group> groups;
  std::vector<ptrdiff_t> group_of(atoms.size(), -1);
  for (size_t a = 0; a < atoms.size(); ++a) {
    size_t root = find(a);
    if (group_of[root] < 0) {
      group_of[root] = static_cast<ptrdiff_t>(groups.size());
      groups.emplace_back();
    }
    Group& g = groups[static_cast<size_t>(group_of[root])];
    const Entry& e = atoms[a];
    g.size += Eighths(e.is_module() ? ctx.sizes->node[static_cast<size_t>(e.node)]
                                    : ctx.sizes->tensor[static_cast<size_t>(e.tensor)]);
    g.atoms.push_back(e);
  }
  return groups;
}

}  // namespace

std::vector<size_t> MinMaxPartition(const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& caps) {
  if (caps.empty()) return {};
  if (LongestPrefix(sizes, caps, nullptr) < sizes.size()) return {};
  int64_t lo = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  int64_t hi = std::max(lo, *std::max_element(caps.begin(), caps.end()));
  auto capped = [&](int64_t limit) {
    std::vector<int64_t> c(caps);
    for (int64_t& x : c) x = std::min(x, limit);
    return c;
  };
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (LongestPrefix(sizes, capped(mid), nullptr) == sizes.size()) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<size_t> counts;
  LongestPrefix(sizes, capped(lo), &counts);
  return counts;
}

namespace {

// Reserves room on the first GPU for the largest layer left off the GPUs, until stable: returns
// how many groups the GPUs take, with `caps` lowered and `reserve` set accordingly.
size_t ReserveForOffload(const std::vector<int64_t>& sizes, std::vector<int64_t>* caps,
                         int64_t* reserve) {
  while (true) {
    std::vector<int64_t> reserved = *caps;
    if (!reserved.empty()) reserved[0] = std::max<int64_t>(0, reserved[0] - *reserve);
    const size_t prefix = LongestPrefix(sizes, reserved, nullptr);
    int64_t largest_rest = 0;
    for (size_t i = prefix; i < sizes.size(); ++i) largest_rest = std::max(largest_rest, sizes[i]);
    if (largest_rest <= *reserve) {
      *caps = reserved;
      return prefix;
    }
    *reserve = largest_rest;
  }
}

// The --explain lines of a min-max placement.
void ExplainMinMax(const std::vector<Device>& gpus, const std::vector<size_t>& counts,
                   const std::vector<int64_t>& sizes, size_t prefix, int64_t reserve,
                   std::vector<std::string>* explanation) {
  int64_t largest = 0;
  size_t at = 0;
  for (size_t part = 0; part < counts.size(); ++part) {
    int64_t load = 0;
    for (size_t k = 0; k < counts[part]; ++k) load += sizes[at++];
    largest = std::max(largest, load);
    explanation->push_back(fmt::format("min-max: {} gets {} layers ({} bytes)",
                                       gpus[part].ToKey(), counts[part], (load + 7) / 8));
  }
  explanation->push_back(fmt::format(
      "min-max: {} layers, {} on GPUs (reserve {} bytes on the first GPU), largest GPU load {} "
      "bytes",
      sizes.size(), prefix, (reserve + 7) / 8, (largest + 7) / 8));
}

}  // namespace

Placement MinMaxPlace(const PlanContext& ctx, const Budgets& budgets) {
  Placement out;
  std::vector<Group> groups = Groups(ctx, Atoms(ctx));
  std::vector<int64_t> sizes;
  for (const Group& g : groups) sizes.push_back(g.size);
  std::vector<Device> gpus;
  std::vector<int64_t> caps;
  for (const Budget& b : budgets) {
    if (b.device.type != Device::Type::kCuda && b.device.type != Device::Type::kMps) continue;
    gpus.push_back(b.device);
    caps.push_back(std::max<int64_t>(0, Eighths(b.bytes)));
  }
  int64_t reserve = 0;
  const size_t prefix = ReserveForOffload(sizes, &caps, &reserve);
  std::vector<int64_t> head(sizes.begin(), sizes.begin() + static_cast<ptrdiff_t>(prefix));
  std::vector<size_t> counts = MinMaxPartition(head, caps);
  std::vector<Device> device_of(groups.size(), Device::Disk());
  size_t next = 0;
  for (size_t part = 0; part < counts.size(); ++part) {
    for (size_t k = 0; k < counts[part]; ++k) device_of[next++] = gpus[part];
  }
  if (const Budget* cpu = FindBudget(budgets, Device::Cpu())) {
    int64_t largest_rest = 0;
    for (size_t i = next; i < sizes.size(); ++i) largest_rest = std::max(largest_rest, sizes[i]);
    int64_t cap = Eighths(cpu->bytes) - largest_rest;
    int64_t load = 0;
    while (next < sizes.size() && load + sizes[next] <= cap) {
      load += sizes[next];
      device_of[next++] = Device::Cpu();
    }
  }
  std::vector<std::pair<Device, PyNum>> used;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const Entry& atom : groups[g].atoms) out.map.Set(atom.name, device_of[g]);
    auto it = std::find_if(used.begin(), used.end(), [&](auto& u) { return u.first == device_of[g]; });
    PyNum bytes = PyNum::Float(static_cast<double>(groups[g].size) / 8.0);
    if (it == used.end()) {
      used.push_back({device_of[g], bytes});
    } else {
      it->second += bytes;
    }
  }
  out.used = std::move(used);
  if (ctx.explain) ExplainMinMax(gpus, counts, sizes, prefix, reserve, &out.explanation);
  return out;
}

}  // namespace loadstone::device_map
