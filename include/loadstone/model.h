// The model as planning sees it: its module tree (modules with class names, parameters and
// buffers with shapes and dtypes, tied parameters), read from a checkpoint's names or from a
// model description file (device_map.h, ParseModelDescription), and the module-name rule that
// keep_in_fp32 uses.
#ifndef LOADSTONE_MODEL_H_
#define LOADSTONE_MODEL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/status.h"

namespace loadstone {

// The module tree of a model: modules (optionally with class names), their parameters and
// buffers with shapes and dtypes, and tied parameters. Copies share immutable state.
class ModuleTree {
 public:
  // Every tensor of the checkpoint is a parameter; modules come from the dotted names. Children
  // are ordered by file, then by name with numbers compared as numbers ("layers.2" before
  // "layers.10"). Errors: InvalidArgument (an empty name component, a name that is both a tensor
  // and a module).
  static Result<ModuleTree> FromCheckpoint(const Checkpoint& checkpoint);

  bool has_classes() const;
  size_t num_modules() const;
  // Every parameter and buffer name, tied names included.
  size_t num_tensors() const;
  // The state-dict names (parameters incl. tied names, persistent buffers), in state-dict order.
  std::vector<std::string> StateDictNames() const;

  struct Impl;  // runtime/device_map/module_tree.h

 private:
  friend struct ModuleTreeAccess;  // how the planner makes and reads trees (module_tree.h)
  explicit ModuleTree(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// loadstone's keep_in_fp32 rule, used by the planner and by Plan(): `key` occurs in `name` as
// whole dotted components, `(^|\.)key($|\.)` ("norm" matches "model.norm.weight", not
// "model.layernorm.weight"; "layers.1" does not match "layers.10"). An empty key matches nothing.
bool MatchesModulePattern(std::string_view name, std::string_view key);

}  // namespace loadstone

#endif  // LOADSTONE_MODEL_H_
