// The methods `loadstone bench` compares, each run in a forked child process so that its time
// and peak RSS are its own.
#ifndef LOADSTONE_TOOLS_BENCH_METHODS_H_
#define LOADSTONE_TOOLS_BENCH_METHODS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/diagnostics.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"

namespace loadstone::cli {

struct BenchMethod {
  enum class Kind {
    kLoadstone,      // Loader with `plan` and `loader` options
    kReadPerTensor,  // naive: a fresh buffer and read() per tensor
    kMmapMemcpy,     // safetensors on CPU: mmap + memcpy per tensor
    kRawCeiling,     // io_uring O_DIRECT, 32 deep, 4 MiB, into scratch (nothing kept)
    kFirstTouch,     // no I/O: allocate `plan`'s destinations and write them on every core
    kExternal,       // a peer in another program: `command` + ["--run", name, FILE...]
  };
  std::string name;
  Kind kind = Kind::kLoadstone;
  PlanOptions plan;
  LoaderOptions loader;
  std::vector<std::string> command;  // kExternal: the peer program's argv prefix
  bool same_work = true;             // every tensor in its own host memory, as loadstone does
};

struct BenchRun {
  double seconds = 0;
  uint64_t bytes = 0;           // bytes of the checkpoint read
  uint64_t peak_rss_bytes = 0;  // the child's (for kExternal: the peer program's) peak RSS
  std::string backend;
};

// Runs `method` once in a child process.
Result<BenchRun> RunMethod(const BenchMethod& method, const Checkpoint& ckpt);

// The peers an external peer program offers: runs `command` + ["--list"], which prints one JSON
// array of {"name": str, "same_work": bool}.
Result<std::vector<BenchMethod>> ListExternalPeers(const std::vector<std::string>& command);

// Drops the checkpoint's files from the page cache (fdatasync + POSIX_FADV_DONTNEED).
Status DropFromPageCache(const Checkpoint& ckpt);

// Fraction of the files' pages resident in the page cache now (mincore).
double ResidentFraction(const Checkpoint& ckpt);

// Reads the checkpoint's files through the page cache, so that a warm run finds them there.
Status WarmPageCache(const Checkpoint& ckpt);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_BENCH_METHODS_H_
