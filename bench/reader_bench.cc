// reader_bench: how fast the Reader backends read one big file from a cold page cache,
// next to the raw device ceiling (io_uring, O_DIRECT, 32 × 4 MiB in flight into a scratch
// buffer — what fio measures) and fio itself when it is installed.
//
//   reader_bench [--file F] [--size-gib N] [--repeat N] [--warm] [--json]
//                [--configs u32x4,b8x16,p8x16] [--sweep] [--raw-sweep]
//
// Methods run in interleaved rounds (a busy minute on a shared disk hits all of them); each
// reports its best and median GB/s and the process's CPU seconds per GB.
//
// The file is created (random bytes) when missing or too small. Before every run the file is
// dropped from the page cache with posix_fadvise(POSIX_FADV_DONTNEED), and the share of it
// still resident is checked with mincore. Destinations are one pre-faulted buffer (1 GiB at
// most, reused round-robin), so the numbers measure reading, not page faults.
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "io/reader.h"

namespace {

using loadstone::io::ReadCompletion;
using loadstone::io::ReaderBackend;
using loadstone::io::ReaderOptions;
using loadstone::io::ReadRequest;
using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer AllocPrefaulted(size_t bytes) {
  Buffer b(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
  if (b) std::memset(b.get(), 0, bytes);
  return b;
}

bool EnsureFile(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    off_t have = ::lseek(fd, 0, SEEK_END);
    ::close(fd);
    if (have >= static_cast<off_t>(size)) return true;
  }
  std::printf("writing %s (%.1f GiB of random bytes)...\n", path.c_str(), size / 1073741824.0);
  fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  std::vector<uint64_t> block((64 << 20) / 8);
  std::mt19937_64 rng(42);
  for (uint64_t done = 0; done < size; done += block.size() * 8) {
    for (uint64_t& w : block) w = rng();
    const size_t n = std::min<uint64_t>(block.size() * 8, size - done);
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) return false;
  }
  ::fsync(fd);
  ::close(fd);
  return true;
}

// The fraction of the file's pages in the page cache (mincore).
double Resident(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  double resident = 0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map != MAP_FAILED) {
    const size_t pages = (size + 4095) / 4096;
    std::vector<unsigned char> vec(pages);
    if (::mincore(map, size, vec.data()) == 0) {
      resident = static_cast<double>(
                     std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return v & 1; })) /
                 pages;
    }
    ::munmap(map, size);
  }
  ::close(fd);
  return resident;
}

// Drops the file from the page cache; returns the fraction still resident afterwards.
double DropCache(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 1.0;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return Resident(path, size);
}

// Reads the file once through the page cache; returns the fraction resident afterwards.
double WarmCache(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  std::vector<char> buf(16 << 20);
  for (uint64_t off = 0; off < size;) {
    ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - off), off);
    if (n <= 0) break;
    off += n;
  }
  ::close(fd);
  return Resident(path, size);
}

// The raw device ceiling: O_DIRECT io_uring reads of `block` bytes, `depth` in flight.
double RawUring(const std::string& path, uint64_t size, unsigned depth, uint64_t block,
                bool fixed = false) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return 0;
  io_uring ring;
  if (io_uring_queue_init(depth, &ring, 0) != 0) return 0;
  Buffer scratch(static_cast<std::byte*>(std::aligned_alloc(4096, depth * block)));
  std::memset(scratch.get(), 0, depth * block);
  iovec iov{scratch.get(), depth * block};
  if (fixed && io_uring_register_buffers(&ring, &iov, 1) != 0) fixed = false;
  uint64_t next = 0, done = 0;
  unsigned in_flight = 0;
  const auto start = Clock::now();
  auto queue = [&](unsigned slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    const auto len = static_cast<unsigned>(std::min(block, size - next));
    if (fixed) {
      io_uring_prep_read_fixed(sqe, fd, scratch.get() + slot * block, len, next, 0);
    } else {
      io_uring_prep_read(sqe, fd, scratch.get() + slot * block, len, next);
    }
    io_uring_sqe_set_data64(sqe, slot);
    next += block;
    ++in_flight;
  };
  for (unsigned s = 0; s < depth && next < size; ++s) queue(s);
  while (in_flight > 0) {
    io_uring_submit_and_wait(&ring, 1);
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      const unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      if (cqe->res <= 0) std::fprintf(stderr, "raw read failed: %d\n", cqe->res);
      done += cqe->res > 0 ? cqe->res : 0;
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      if (next < size) queue(slot);
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  io_uring_queue_exit(&ring);
  ::close(fd);
  return done / seconds / 1e9;
}

// The whole file through a Reader, as requests of `request` bytes into `dst` (reused round
// robin, `misalign` bytes past each page boundary to force the bounce path).
double ThroughReader(const std::string& path, uint64_t size, const ReaderOptions& options,
                     std::byte* dst, uint64_t dst_bytes, uint64_t request, uint64_t misalign,
                     std::string* describe) {
  auto reader = loadstone::io::OpenReader({path}, options);
  if (!reader.ok()) {
    std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
    return 0;
  }
  *describe = (*reader)->Describe();
  std::vector<ReadRequest> requests;
  for (uint64_t off = 0; off < size; off += request) {
    const uint64_t slot = (off / request) % (dst_bytes / (request + 4096));
    requests.push_back({0, off, std::min(request, size - off),
                        dst + slot * (request + 4096) + misalign + off % 4096, off});
  }
  const auto start = Clock::now();
  (*reader)->Submit(requests);
  std::vector<ReadCompletion> done;
  while (done.size() < requests.size()) {
    pollfd pfd{(*reader)->completion_fd(), POLLIN, 0};
    ::poll(&pfd, 1, 1000);
    (*reader)->Reap(&done);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const ReadCompletion& c : done) {
    if (!c.status.ok()) std::fprintf(stderr, "%s\n", c.status.ToString().c_str());
  }
  const auto stats = (*reader)->stats();
  *describe += fmt::format(" | direct {:.0f}% bounced {:.0f}% resubmits {}",
                           100.0 * stats.direct_bytes / size, 100.0 * stats.bounced_bytes / size,
                           stats.resubmits);
  return size / seconds / 1e9;
}

double Fio(const std::string& path, uint64_t size) {
  if (std::system("command -v fio >/dev/null 2>&1") != 0) return 0;
  const std::string cmd = fmt::format(
      "fio --name=cold --filename={} --rw=read --bs=4M --iodepth=32 --ioengine=io_uring "
      "--direct=1 --size={} --output-format=json 2>/dev/null",
      path, size);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(cmd.c_str(), "r"), ::pclose);
  if (!pipe) return 0;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  auto json = nlohmann::json::parse(out, nullptr, false);
  if (json.is_discarded()) return 0;
  return json["jobs"][0]["read"]["bw_bytes"].get<double>() / 1e9;
}

double CpuSeconds() {
  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Cold-cache read throughput of the Reader backends against the device ceiling");
  std::string path = "/var/tmp/loadstone-bench/data4g.bin";
  double size_gib = 4;
  int repeat = 3;
  bool sweep = false, raw_sweep = false, json_out = false, warm = false;
  uint64_t request_mib = 64;
  app.add_option("--file", path, "file to read (created if missing)");
  app.add_option("--size-gib", size_gib, "bytes to read, GiB");
  app.add_option("--repeat", repeat, "runs per method (best and median reported)");
  app.add_option("--request-mib", request_mib, "size of each request handed to a Reader");
  uint64_t dst_mib = 1024;
  app.add_option("--dst-mib", dst_mib, "destination memory the requests cycle through");
  app.add_flag("--sweep", sweep, "also sweep queue depth × chunk size and bounce sizes");
  std::string configs;
  app.add_option("--configs", configs,
                 "UringReader settings to compare, in phase: DEPTHxCHUNK_MIB,... e.g. 64x16,8x4");
  app.add_flag("--raw-sweep", raw_sweep, "sweep the raw O_DIRECT reads: depth × block size");
  app.add_flag("--warm", warm, "keep the file in the page cache instead of dropping it");
  app.add_flag("--json", json_out, "print the results as JSON");
  CLI11_PARSE(app, argc, argv);

  const uint64_t size = static_cast<uint64_t>(size_gib * 1073741824.0) / 4096 * 4096;
  if (!EnsureFile(path, size)) {
    std::fprintf(stderr, "cannot create %s\n", path.c_str());
    return 1;
  }
  const uint64_t request = request_mib << 20;
  const uint64_t dst_bytes =
      std::max<uint64_t>(std::min<uint64_t>(size, dst_mib << 20), 2 * (request + 4096));
  Buffer dst = AllocPrefaulted(dst_bytes + 8192);

  struct Method {
    std::string name;
    std::function<double(std::string*)> run;
  };
  std::vector<Method> methods;
  methods.push_back({"raw io_uring O_DIRECT QD32 4MiB", [&](std::string* d) {
                       *d = "scratch buffer";
                       return RawUring(path, size, 32, 4 << 20);
                     }});
  if (raw_sweep) {
    for (unsigned qd : {1u, 2u, 4u, 8u, 16u, 32u}) {
      for (uint64_t block : {1, 4, 16}) {
        methods.push_back({fmt::format("raw io_uring O_DIRECT QD{} {}MiB", qd, block),
                           [&, qd, block](std::string* d) {
                             *d = "scratch buffer";
                             return RawUring(path, size, qd, block << 20);
                           }});
      }
    }
  }
  methods.push_back({"raw io_uring O_DIRECT QD32 4MiB registered", [&](std::string* d) {
                       *d = "scratch buffer registered with the ring";
                       return RawUring(path, size, 32, 4 << 20, true);
                     }});
  auto reader = [&](std::string name, ReaderOptions o, uint64_t misalign) {
    methods.push_back({std::move(name), [&, o, misalign](std::string* d) {
                         return ThroughReader(path, size, o, dst.get(), dst_bytes, request,
                                              misalign, d);
                       }});
  };
  ReaderOptions uring;
  uring.backend = ReaderBackend::kUring;
  ReaderOptions pread;
  pread.backend = ReaderBackend::kPread;
  reader("UringReader defaults, dst in phase", uring, 0);
  reader("UringReader defaults, dst out of phase", uring, 64);
  ReaderOptions buffered = uring;
  buffered.direct = false;
  reader("UringReader page cache (direct=false)", buffered, 0);
  reader("PreadReader defaults", pread, 0);
  // --configs: [u|b|p]DEPTHxCHUNK_MIB — u: UringReader (in phase), b: UringReader with
  // direct=false, p: PreadReader (DEPTH is then its thread count).
  for (size_t at = 0; at < configs.size();) {
    size_t end = configs.find(',', at);
    if (end == std::string::npos) end = configs.size();
    std::string one = configs.substr(at, end - at);
    char kind = 'u';
    if (!one.empty() && std::isalpha(static_cast<unsigned char>(one[0]))) {
      kind = one[0];
      one = one.substr(1);
    }
    int qd = 0;
    unsigned long long chunk = 0;
    if (std::sscanf(one.c_str(), "%dx%llu", &qd, &chunk) == 2) {
      ReaderOptions o = kind == 'p' ? pread : uring;
      o.direct = kind != 'b';
      o.queue_depth = qd;
      o.threads = qd;
      o.max_chunk = chunk << 20;
      const char* name = kind == 'p'   ? "PreadReader"
                         : kind == 'b' ? "UringReader buffered"
                                       : "UringReader";
      reader(fmt::format("{} {}{} chunk {}MiB", name, kind == 'p' ? "threads " : "QD", qd, chunk),
             o, 0);
    }
    at = end + 1;
  }
  if (sweep) {
    for (int qd : {4, 8, 16, 32, 64}) {
      for (uint64_t chunk : {1, 2, 4, 8, 16}) {
        ReaderOptions o = uring;
        o.queue_depth = qd;
        o.max_chunk = chunk << 20;
        reader(fmt::format("UringReader QD{} chunk {}MiB", qd, chunk), o, 0);
      }
    }
    for (uint64_t bounce : {8, 16, 32, 64, 128}) {
      ReaderOptions o = uring;
      o.bounce_bytes = bounce << 20;
      reader(fmt::format("UringReader out of phase, bounce {}MiB", bounce), o, 64);
    }
    for (int threads : {2, 4, 8, 16}) {
      ReaderOptions o = pread;
      o.threads = threads;
      reader(fmt::format("PreadReader {} threads", threads), o, 0);
    }
  }
  methods.push_back({"fio io_uring O_DIRECT QD32 4MiB", [&](std::string* d) {
                       *d = "fio --rw=read --bs=4M --iodepth=32 --direct=1";
                       return Fio(path, size);
                     }});

  // Rounds interleave the methods, so that a slow minute on a shared disk does not land on
  // one method only.
  std::printf(
      "file %s, %.2f GiB, %s, %d rounds\n", path.c_str(), size / 1073741824.0,
      warm ? "warm (read once before each run)" : "cold (POSIX_FADV_DONTNEED before each run)",
      repeat);
  std::vector<std::vector<double>> gbps(methods.size());
  std::vector<double> cpu(methods.size());  // CPU seconds of this process per GB read
  std::vector<std::string> details(methods.size());
  double resident = 0;
  for (int round = 0; round < repeat; ++round) {
    for (size_t i = 0; i < methods.size(); ++i) {
      resident = std::max(resident, warm ? WarmCache(path, size) : DropCache(path, size));
      const double cpu_before = CpuSeconds();
      gbps[i].push_back(methods[i].run(&details[i]));
      cpu[i] += (CpuSeconds() - cpu_before) / (size / 1e9) / repeat;
    }
  }
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < methods.size(); ++i) {
    std::vector<double> runs = gbps[i];
    std::sort(runs.begin(), runs.end());
    const double best = runs.back(), median = runs[runs.size() / 2];
    std::printf("%-44s best %5.2f GB/s  median %5.2f GB/s  cpu %5.3f s/GB  %s\n",
                methods[i].name.c_str(), best, median, cpu[i], details[i].c_str());
    results.push_back({{"method", methods[i].name},
                       {"best_gbps", best},
                       {"median_gbps", median},
                       {"cpu_s_per_gb", cpu[i]},
                       {"runs", gbps[i]},
                       {"detail", details[i]}});
  }
  std::printf("%s: at most %.1f%% of the file was in the page cache before a run\n",
              warm ? "warm" : "cold", resident * 100);
  if (json_out) std::printf("%s\n", results.dump(2).c_str());
  return 0;
}
