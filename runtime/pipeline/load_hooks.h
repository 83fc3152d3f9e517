// Fault injection for loadstone's own tests: how a test changes the loads of one Loader
// (LoaderOptions::hooks). Nothing in production sets them; the machine itself (Platform) knows
// nothing of them.
#ifndef LOADSTONE_RUNTIME_PIPELINE_LOAD_HOOKS_H_
#define LOADSTONE_RUNTIME_PIPELINE_LOAD_HOOKS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/reader.h"
#include "loadstone/loader.h"

namespace loadstone {

// How a load opens its reader; io::OpenReader unless a test wraps it.
using ReaderFactory = std::function<Result<std::unique_ptr<io::Reader>>(
    const std::vector<std::string>& paths, const io::ReaderOptions& options, std::string* log)>;

// Points in a load where a test cancels it on purpose (LoadHooks::cancel_at): as the first
// reads are about to be issued, once the first read is back, as a worker starts a conversion,
// as a device job is submitted, as a worker starts completing the Hub cache after the reads.
enum class LoadStage { kBeforeFirstRead, kMidStream, kConverting, kDeviceCopy, kCompletingCache };

struct LoadHooks {
  ReaderFactory open_reader;  // unset: io::OpenReader
  // Asked at each LoadStage (from the thread at that stage); true cancels the load there, as
  // LoadHandle::Cancel from another thread at that moment would. Unset: never.
  std::function<bool(LoadStage stage)> cancel_at;
  // Asked as a load opens fresh pages: true refuses them, as a kernel without userfaultfd
  // (vm.unprivileged_userfaultfd = 0) would. Unset: never.
  std::function<bool()> refuse_userfaultfd;
  // Asked as disk offload (WriteOffload) creates the file it writes NAME.dat `path` through: a
  // descriptor to write into instead, which the write then owns (a test gives /dev/full, whose
  // writes fail with ENOSPC as a full disk's do); -1: the file is created as usual. Unset: never.
  std::function<int(const std::string& path)> create_offload_file;
};

// What loadstone's own parts (disk offload) may ask of a Loader beyond its public face.
struct LoaderAccess {
  // LoaderOptions::hooks of `loader`; null when none were given.
  static const LoadHooks* Hooks(const Loader& loader);
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_PIPELINE_LOAD_HOOKS_H_
