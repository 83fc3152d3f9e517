// What the CLI writes (convert's file or folder, the demo model): outputs appear whole at their
// target or not at all, never over an input, never over what the user made.
#ifndef LOADSTONE_TOOLS_OUTPUT_H_
#define LOADSTONE_TOOLS_OUTPUT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loadstone/status.h"

namespace loadstone::cli {

// InvalidArgument when `output` is one of `inputs`, lies inside one of them (a folder), or holds
// one: files and folders are compared by device and inode, so no spelling (a symlink, "..", a
// trailing slash, a hard link) hides it. `what` names the output in the message ("OUT").
Status RefuseInputAsOutput(const std::string& output, const std::vector<std::string>& inputs,
                           const std::string& what);

// An output written under a temporary name beside its target (".NAME.loadstone-XXXXXX", same
// folder) and renamed into place by Commit(). Until then the target is untouched; destroyed
// uncommitted (a failure, Ctrl-C) it removes the temporary and the parent folders Begin made,
// and nothing else.
class StagedOutput {
 public:
  enum class Kind { kFile, kFolder };
  struct Options {
    Kind kind = Kind::kFile;
    std::string what = "OUT";  // how messages name the target
    // When the target exists (for kFolder: and is not an empty folder): OK to replace it whole
    // at Commit(), or the error to refuse with. Unset: an existing target is refused.
    std::function<Status(const std::string& target)> may_replace;
  };

  // Makes the temporary (an empty file or folder). The target's symlinks are resolved: Commit
  // replaces what the link points to, not the link.
  static Result<std::unique_ptr<StagedOutput>> Begin(const std::string& target, Options options);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  const std::string& path() const { return temp_; }      // write here
  const std::string& target() const { return target_; }  // where it goes
  // `written` (paths under path()) as they will be at the target.
  std::vector<std::string> AtTarget(const std::vector<std::string>& written) const;
  // Moves the output into place; a replaced target is removed after the move.
  Status Commit();

 private:
  StagedOutput() = default;
  Options options_;
  std::string target_, temp_;
  bool replace_ = false;                 // the target exists and may be replaced
  std::vector<std::string> made_dirs_;  // parents Begin created, outermost first
  bool committed_ = false;
};

// For StagedOutput::Options::may_replace: OK for a folder that holds only what `convert` writes
// (*.safetensors, their index, config.json); otherwise the error naming what else it holds.
Status OnlyCheckpointFiles(const std::string& folder);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_OUTPUT_H_
