#include "tools/loadstone/bench_methods.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace loadstone::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Freer {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte, Freer>;

HostBuffer Allocate(uint64_t bytes) {
  return HostBuffer(static_cast<std::byte*>(
      std::aligned_alloc(64, (std::max<uint64_t>(bytes, 1) + 63) / 64 * 64)));
}

Status Errno(std::string_view what, const std::string& path) {
  return Status::IOError(fmt::format("{} '{}': {}", what, path, std::strerror(errno)));
}

// What a naive loader does: for each tensor, a fresh buffer and read() calls.
Status ReadPerTensor(const Checkpoint& ckpt, std::vector<HostBuffer>* keep) {
  for (size_t f = 0; f < ckpt.files().size(); ++f) {
    const int fd = ::open(ckpt.files()[f].path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", ckpt.files()[f].path);
    for (const TensorInfo& t : ckpt.tensors()) {
      if (t.file != f) continue;
      HostBuffer buffer = Allocate(t.nbytes);
      if (::lseek(fd, static_cast<off_t>(t.offset), SEEK_SET) < 0)
        return Errno("seek", ckpt.files()[f].path);
      for (uint64_t done = 0; done < t.nbytes;) {
        const ssize_t n = ::read(fd, buffer.get() + done, t.nbytes - done);
        if (n <= 0) {
          ::close(fd);
          return Errno("read", ckpt.files()[f].path);
        }
        done += static_cast<uint64_t>(n);
      }
      keep->push_back(std::move(buffer));
    }
    ::close(fd);
  }
  return Status::OK();
}

// What safetensors does for CPU: mmap the file, copy each tensor into its own buffer.
Status MmapMemcpy(const Checkpoint& ckpt, std::vector<HostBuffer>* keep) {
  for (size_t f = 0; f < ckpt.files().size(); ++f) {
    const CheckpointFile& file = ckpt.files()[f];
    const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", file.path);
    void* map = ::mmap(nullptr, file.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return Errno("mmap", file.path);
    for (const TensorInfo& t : ckpt.tensors()) {
      if (t.file != f) continue;
      HostBuffer buffer = Allocate(t.nbytes);
      std::memcpy(buffer.get(), static_cast<const std::byte*>(map) + t.offset, t.nbytes);
      keep->push_back(std::move(buffer));
    }
    ::munmap(map, file.bytes);
  }
  return Status::OK();
}

// The tensors go to `keep`, freed after the clock stops like every other method's buffers
// (freeing 3.6 GiB inside the timed region cost loadstone 0.1-0.4 s here).
Status RunLoadstone(const Checkpoint& ckpt, const PlanOptions& plan_options,
                    const LoaderOptions& loader_options, std::string* backend,
                    std::vector<loadstone::Tensor>* keep) {
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(ckpt, plan_options));
  Loader loader(loader_options);
  LoadHandle load = loader.Load(ckpt, plan);
  Status status = load.Done().get();
  *backend = load.backend();
  *keep = load.Tensors();
  return status;
}

// The cost of fresh memory alone: the bytes a load with `plan_options` places, one buffer per
// planned tensor (malloc's: where the Loader gives small tensors shared buffers, this costs a
// little more bookkeeping than the Loader pays), each written once, split over every core. A load
// that converts can go no faster than this (the kernel zeroes and maps each new page on first
// touch).
Status FirstTouch(const Checkpoint& ckpt, const PlanOptions& plan_options,
                  std::vector<HostBuffer>* keep) {
  LOADSTONE_ASSIGN_OR_RETURN(LoadPlan plan, Plan(ckpt, plan_options));
  keep->resize(plan.tensors.size());
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      for (size_t i = k; i < plan.tensors.size(); i += threads) {
        (*keep)[i] = Allocate(plan.tensors[i].nbytes);
        if ((*keep)[i]) std::memset((*keep)[i].get(), 0x5A, plan.tensors[i].nbytes);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (!(*keep)[i] && plan.tensors[i].nbytes > 0) {
      return Status::OutOfMemory(fmt::format("{} bytes", plan.tensors[i].nbytes));
    }
  }
  return Status::OK();
}

// Runs `argv` to completion; its stdout and stderr together.
Result<std::string> RunProgram(const std::vector<std::string>& argv) {
  if (argv.empty()) return Status::InvalidArgument("empty peer command");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Errno("pipe", argv[0]);
  const pid_t pid = ::fork();
  if (pid < 0) return Errno("fork for", argv[0]);
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    const std::string msg =
        fmt::format("{{\"error\": \"cannot run {}: {}\"}}\n", argv[0], std::strerror(errno));
    ssize_t ignored = ::write(STDOUT_FILENO, msg.data(), msg.size());
    (void)ignored;
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  return out;
}

// The JSON document that ends `text`: the longest run of its last lines that parses (a peer may
// print warnings before it, and its document over several lines).
Result<nlohmann::json> TrailingJson(const std::string& text, const std::string& program) {
  std::optional<nlohmann::json> found;
  for (size_t from = text.size(); from > 0;) {
    from = text.rfind('\n', from - 1);
    from = from == std::string::npos ? 0 : from;
    auto doc = nlohmann::json::parse(text.substr(from), nullptr, false);
    if (!doc.is_discarded())
      found = std::move(doc);
    else if (found)
      break;
  }
  if (found && !found->is_null()) return *std::move(found);
  const std::string tail = text.size() > 300 ? text.substr(text.size() - 300) : text;
  return Status::IOError(
      fmt::format("peer program '{}' printed no JSON; its output ends: {}", program, tail));
}

// One timed run of an external peer; the time is the one the peer reports (its imports and
// start-up excluded), the peak RSS that of the peer's process.
Status RunExternal(const BenchMethod& method, const Checkpoint& ckpt, double* seconds) {
  std::vector<std::string> argv = method.command;
  argv.insert(argv.end(), {"--run", method.name});
  for (const CheckpointFile& f : ckpt.files()) argv.push_back(f.path);
  LOADSTONE_ASSIGN_OR_RETURN(std::string out, RunProgram(argv));
  LOADSTONE_ASSIGN_OR_RETURN(nlohmann::json doc, TrailingJson(out, argv[0]));
  if (doc.contains("error")) {
    return Status::IOError(doc["error"].is_string() ? doc["error"].get<std::string>()
                                                    : doc["error"].dump());
  }
  if (!doc.contains("seconds") || !doc["seconds"].is_number()) {
    return Status::IOError(
        fmt::format("peer '{}' reported no seconds: {}", method.name, doc.dump()));
  }
  *seconds = doc["seconds"].get<double>();
  return Status::OK();
}

// The child's report, written whole through a pipe.
struct ChildReport {
  double seconds = 0;
  uint64_t bytes = 0;
  int64_t peak_rss_kib = 0;
  char backend[1024] = {};  // whole: the longest description is about 200 characters
  char error[512] = {};
};

ChildReport RunInChild(const BenchMethod& method, const Checkpoint& ckpt) {
  ChildReport report;
  std::vector<HostBuffer> keep;
  std::vector<loadstone::Tensor> keep_tensors;
  std::string backend = method.name;
  double external_seconds = 0;
  const auto start = Clock::now();
  Status status;
  switch (method.kind) {
    case BenchMethod::Kind::kLoadstone:
      status = RunLoadstone(ckpt, method.plan, method.loader, &backend, &keep_tensors);
      break;
    case BenchMethod::Kind::kReadPerTensor:
      status = ReadPerTensor(ckpt, &keep);
      break;
    case BenchMethod::Kind::kMmapMemcpy:
      status = MmapMemcpy(ckpt, &keep);
      break;
    case BenchMethod::Kind::kFirstTouch:
      status = FirstTouch(ckpt, method.plan, &keep);
      break;
    case BenchMethod::Kind::kRawCeiling: {
      std::vector<std::string> paths;
      for (const auto& f : ckpt.files()) paths.push_back(f.path);
      auto raw = MeasureRawRead(paths, {});
      if (raw.ok()) backend = raw->backend;
      status = raw.status();
      break;
    }
    case BenchMethod::Kind::kExternal:
      status = RunExternal(method, ckpt, &external_seconds);
      break;
  }
  report.seconds = method.kind == BenchMethod::Kind::kExternal
                       ? external_seconds
                       : std::chrono::duration<double>(Clock::now() - start).count();
  report.bytes = ckpt.total_bytes();
  rusage usage{};
  ::getrusage(method.kind == BenchMethod::Kind::kExternal ? RUSAGE_CHILDREN : RUSAGE_SELF, &usage);
  report.peak_rss_kib = usage.ru_maxrss;
  std::snprintf(report.backend, sizeof(report.backend), "%s", backend.c_str());
  if (!status.ok())
    std::snprintf(report.error, sizeof(report.error), "%s", status.ToString().c_str());
  return report;
}

}  // namespace

Status DropFromPageCache(const Checkpoint& ckpt) {
  for (const CheckpointFile& f : ckpt.files()) {
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", f.path);
    ::fdatasync(fd);
    const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (err != 0) {
      errno = err;
      return Errno("posix_fadvise(DONTNEED)", f.path);
    }
  }
  return Status::OK();
}

Status WarmPageCache(const Checkpoint& ckpt) {
  constexpr size_t kChunk = 8 << 20;
  // Mapped and unmapped each time, not malloc'd: an 8 MiB heap block per call stayed in this
  // (parent) process's RSS, 8 MiB more every run, and every forked child inherits that RSS.
  void* map = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return Status::OutOfMemory("cannot map 8 MiB to read the files with");
  const std::unique_ptr<void, void (*)(void*)> buffer(map, [](void* p) { ::munmap(p, kChunk); });
  for (const CheckpointFile& f : ckpt.files()) {
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", f.path);
    ssize_t n;
    do {
      n = ::read(fd, map, kChunk);
    } while (n > 0 || (n < 0 && errno == EINTR));
    const int err = errno;
    ::close(fd);
    if (n < 0) {
      errno = err;
      return Errno("read", f.path);
    }
  }
  return Status::OK();
}

double ResidentFraction(const Checkpoint& ckpt) {
  uint64_t resident = 0, pages = 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  for (const CheckpointFile& f : ckpt.files()) {
    if (f.bytes == 0) continue;
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    void* map = ::mmap(nullptr, f.bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) continue;
    const size_t n = (f.bytes + page - 1) / page;
    std::vector<unsigned char> vec(n);
    if (::mincore(map, f.bytes, vec.data()) == 0) {
      for (unsigned char v : vec) resident += v & 1;
      pages += n;
    }
    ::munmap(map, f.bytes);
  }
  return pages ? double(resident) / double(pages) : 0;
}

Result<BenchRun> RunMethod(const BenchMethod& method, const Checkpoint& ckpt) {
  // The child starts with this process's resident pages (fork copies the page tables, and they
  // count in the child's RSS): give the heap's free memory back first, so that a run's peak RSS
  // is its own plus the catalog it shares, as in a program that opens and loads.
  ::malloc_trim(0);
  int fds[2];
  if (::pipe(fds) != 0) return Status::IOError("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) return Status::IOError(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    ::close(fds[0]);
    const ChildReport report = RunInChild(method, ckpt);
    ssize_t ignored = ::write(fds[1], &report, sizeof(report));
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildReport report;
  size_t got = 0;
  while (got < sizeof(report)) {
    const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(&report) + got, sizeof(report) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (got != sizeof(report)) {
    return Status::IOError(
        fmt::format("benchmark '{}' died (wait status {})", method.name, wstatus));
  }
  if (report.error[0])
    return Status::IOError(fmt::format("benchmark '{}': {}", method.name, report.error));
  BenchRun run;
  run.seconds = report.seconds;
  run.bytes = report.bytes;
  run.peak_rss_bytes = static_cast<uint64_t>(report.peak_rss_kib) * 1024;
  run.backend = report.backend;
  return run;
}

Result<std::vector<BenchMethod>> ListExternalPeers(const std::vector<std::string>& command) {
  std::vector<std::string> argv = command;
  argv.push_back("--list");
  LOADSTONE_ASSIGN_OR_RETURN(std::string out, RunProgram(argv));
  LOADSTONE_ASSIGN_OR_RETURN(nlohmann::json doc, TrailingJson(out, argv[0]));
  if (!doc.is_array()) {
    return Status::IOError(fmt::format("'{} --list' printed {}, not a JSON array of peers", argv[0],
                                       doc.dump().substr(0, 300)));
  }
  std::vector<BenchMethod> peers;
  for (const auto& entry : doc) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
      return Status::IOError(
          fmt::format("'{} --list': a peer without a name: {}", argv[0], entry.dump()));
    }
    BenchMethod m;
    m.name = entry["name"].get<std::string>();
    m.kind = BenchMethod::Kind::kExternal;
    m.command = command;
    m.same_work = entry.value("same_work", false);
    peers.push_back(std::move(m));
  }
  return peers;
}

}  // namespace loadstone::cli
