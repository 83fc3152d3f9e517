// The no-split set: modules that are never divided across devices, by class name or name glob.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_NO_SPLIT_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_NO_SPLIT_H_

#include <string>
#include <string_view>
#include <vector>

#include "runtime/device_map/module_tree.h"

namespace loadstone::device_map {

// fnmatch-style over dotted names: '*' and '?' do not cross '.', "[abc]" / "[!abc]" classes.
bool GlobMatch(std::string_view pattern, std::string_view name);

// True when `entry` is a name glob rather than a class name.
bool IsNameGlob(std::string_view entry);

class NoSplit {
 public:
  NoSplit(const ModuleTree::Impl& tree, std::vector<std::string> entries);

  const std::vector<std::string>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  // The module is in the set (accelerate: `module.__class__.__name__ in no_split_module_classes`).
  bool Contains(int32_t node) const { return member_[static_cast<size_t>(node)]; }
  // Whether entry `i` matches the module.
  bool EntryMatches(size_t i, int32_t node) const;

 private:
  const ModuleTree::Impl* tree_;
  std::vector<std::string> entries_;
  std::vector<bool> member_;
};

// loadstone's default: for every module with at least two children named by numbers, the glob
// "<module>.*" (the numbered blocks stay whole); blocks are not searched inside.
std::vector<std::string> DefaultNoSplit(const ModuleTree::Impl& tree);

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_NO_SPLIT_H_
