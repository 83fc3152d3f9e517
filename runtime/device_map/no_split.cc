#include "runtime/device_map/no_split.h"

#include <algorithm>

namespace loadstone::device_map {
namespace {

std::string_view LocalName(std::string_view name) {
  size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

bool IsNumber(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Matches "[...]" at pattern[0]; *consumed is the class length, or 0 when malformed.
bool ClassMatch(std::string_view pattern, char c, size_t* consumed) {
  size_t i = 1;
  bool negate = i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^');
  if (negate) ++i;
  bool matched = false;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      matched = matched || (pattern[i] <= c && c <= pattern[i + 2]);
      i += 3;
    } else {
      matched = matched || pattern[i] == c;
      ++i;
    }
  }
  if (i >= pattern.size()) {
    *consumed = 0;
    return false;
  }
  *consumed = i + 1;
  return matched != negate;
}

// Whether the pattern token at pattern[0] ('?', a class or a literal) matches `c`; *length is
// the token's length.
bool TokenMatches(std::string_view pattern, char c, size_t* length) {
  *length = 1;
  if (pattern[0] == '?') return c != '.';
  if (pattern[0] == '[') {
    size_t consumed = 0;
    const bool matched = ClassMatch(pattern, c, &consumed);
    if (consumed > 0) {
      *length = consumed;
      return matched && c != '.';
    }
  }
  return pattern[0] == c;
}

}  // namespace

// Iterative, with one backtracking point (the last '*'): O(pattern x name), no recursion. That
// is exact here because a '*' never takes a '.': dots are matched only by literal dots, so any
// match of the pattern before the last '*' ends in the same component as the leftmost one.
bool GlobMatch(std::string_view pattern, std::string_view name) {
  size_t pi = 0, ni = 0;
  size_t star_pi = std::string_view::npos, star_ni = 0;
  while (ni < name.size()) {
    if (pi < pattern.size() && pattern[pi] == '*') {
      star_pi = ++pi;
      star_ni = ni;
      continue;
    }
    size_t length = 0;
    if (pi < pattern.size() && TokenMatches(pattern.substr(pi), name[ni], &length)) {
      pi += length;
      ++ni;
      continue;
    }
    if (star_pi != std::string_view::npos && name[star_ni] != '.') {
      pi = star_pi;  // the last '*' takes one more character
      ni = ++star_ni;
      continue;
    }
    return false;
  }
  while (pi < pattern.size() && pattern[pi] == '*') ++pi;
  return pi == pattern.size();
}

bool IsNameGlob(std::string_view entry) {
  return entry.find_first_of(".*?[") != std::string_view::npos;
}

NoSplit::NoSplit(const ModuleTree::Impl& tree, std::vector<std::string> entries)
    : tree_(&tree), entries_(std::move(entries)), member_(tree.nodes.size(), false) {
  for (size_t n = 1; n < tree.nodes.size(); ++n) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (EntryMatches(i, static_cast<int32_t>(n))) {
        member_[n] = true;
        break;
      }
    }
  }
}

bool NoSplit::EntryMatches(size_t i, int32_t node) const {
  const TreeNode& tn = tree_->nodes[static_cast<size_t>(node)];
  const std::string& entry = entries_[i];
  if (node == 0) return !tn.class_name.empty() && tn.class_name == entry;
  if (IsNameGlob(entry)) return GlobMatch(entry, tn.name);
  if (!tn.class_name.empty() && tn.class_name == entry) return true;
  return !tree_->has_classes && tn.name == entry;
}

std::vector<std::string> DefaultNoSplit(const ModuleTree::Impl& tree) {
  std::vector<std::string> globs;
  std::vector<int32_t> stack = {0};
  while (!stack.empty()) {
    const TreeNode& node = tree.nodes[static_cast<size_t>(stack.back())];
    stack.pop_back();
    size_t numbered = 0;
    for (int32_t c : node.children) {
      if (IsNumber(LocalName(tree.nodes[static_cast<size_t>(c)].name))) ++numbered;
    }
    bool blocks = numbered >= 2;
    if (blocks) globs.push_back(node.name.empty() ? "*" : std::string(node.name) + ".*");
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
      bool is_block = blocks && IsNumber(LocalName(tree.nodes[static_cast<size_t>(*it)].name));
      if (!is_block) stack.push_back(*it);
    }
  }
  return globs;
}

}  // namespace loadstone::device_map
