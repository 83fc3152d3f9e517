// torch_bench METHOD MODEL: one timed run of one way to get a checkpoint into LibTorch, for
// bench/torch_bench.py (which runs each in a fresh process, interleaved, and takes medians).
// Prints one JSON line: {"method", "seconds", "bytes", "gbps"}. Methods:
//   load            Loader::Load of the checkpoint into host memory (what `loadstone load` does)
//   state_dict      libtorch::LoadStateDict: the same, handed over as at::Tensors
//   into_fresh      libtorch::LoadInto a model skeleton: parameters take loadstone's buffers
//   into_allocated  libtorch::LoadInto with copy_into_parameters: the parameters' own memory,
//                   allocated and touched before the clock starts (the hot-swap case)
//   libtorch        the plain LibTorch loader an engine writes: each file read whole into one
//                   buffer (pread), tensors made with torch::from_blob at their offsets, then
//                   param.copy_ into the same allocated parameters
//   raw_read        the page-cache read ceiling: every file pread in 16 MiB pieces into reused
//                   buffers, one thread per core (no memory of its own, nothing kept)
// The skeleton (every tensor a parameter of its dtype and shape, nested by dotted name) is built
// and touched before timing for into_* and libtorch, so that all three fill the same memory.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "loadstone/torch.h"

namespace {

using Clock = std::chrono::steady_clock;
using loadstone::libtorch::FromScalarType;
using loadstone::libtorch::ToScalarType;

[[noreturn]] void Die(const loadstone::Status& s) {
  std::cerr << "error: " << s << "\n";
  std::exit(1);
}

// A module tree whose parameters are the checkpoint's tensors, allocated and touched.
std::shared_ptr<torch::nn::Module> Skeleton(const loadstone::Checkpoint& ckpt) {
  auto root = std::make_shared<torch::nn::Module>("Skeleton");
  torch::NoGradGuard no_grad;
  for (const loadstone::TensorInfo& t : ckpt.tensors()) {
    torch::nn::Module* m = root.get();
    std::string name = t.name;
    for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1)) {
      const std::string part = name.substr(0, dot);
      auto children = m->named_children();
      if (auto* child = children.find(part)) {
        m = child->get();
      } else {
        m = m->register_module(part, std::make_shared<torch::nn::Module>()).get();
      }
    }
    auto type = ToScalarType(t.dtype);
    if (!type.ok()) Die(type.status());
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    m->register_parameter(name, torch::zeros(shape, torch::TensorOptions().dtype(*type)), false);
  }
  return root;
}

// Every file read whole, tensors viewed with from_blob, copied into the parameters.
void PlainLibTorch(const loadstone::Checkpoint& ckpt, torch::nn::Module& model) {
  auto params = model.named_parameters();
  torch::NoGradGuard no_grad;
  for (uint32_t f = 0; f < ckpt.files().size(); ++f) {
    const auto& file = ckpt.files()[f];
    std::vector<std::byte> bytes(file.bytes);
    const int fd = ::open(file.path.c_str(), O_RDONLY);
    for (uint64_t done = 0; done < file.bytes;) {
      const ssize_t n = ::pread(fd, bytes.data() + done, file.bytes - done, static_cast<off_t>(done));
      if (n <= 0) Die(loadstone::Status::IOError("read " + file.path));
      done += static_cast<uint64_t>(n);
    }
    ::close(fd);
    for (const loadstone::TensorInfo& t : ckpt.tensors()) {
      if (t.file != f) continue;
      std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
      auto view = torch::from_blob(bytes.data() + t.offset, shape,
                                   torch::TensorOptions().dtype(*ToScalarType(t.dtype)));
      params[t.name].copy_(view);
    }
  }
}

// pread in pieces into one reused buffer per thread (TORCH_BENCH_RAW=THREADSxMIB, default
// 4x4: the fastest of 1-8 threads and 1-16 MiB pieces measured here).
void RawRead(const loadstone::Checkpoint& ckpt) {
  unsigned thread_count = 8, mib = 1;
  if (const char* raw = std::getenv("TORCH_BENCH_RAW")) std::sscanf(raw, "%ux%u", &thread_count, &mib);
  const uint64_t kPiece = uint64_t{mib} << 20;
  struct Piece { uint32_t file; uint64_t offset, length; };
  std::vector<Piece> pieces;
  std::vector<int> fds;
  for (uint32_t f = 0; f < ckpt.files().size(); ++f) {
    fds.push_back(::open(ckpt.files()[f].path.c_str(), O_RDONLY));
    for (uint64_t o = 0; o < ckpt.files()[f].bytes; o += kPiece) {
      pieces.push_back({f, o, std::min(kPiece, ckpt.files()[f].bytes - o)});
    }
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < std::max(1u, thread_count); ++i) {
    threads.emplace_back([&] {
      std::vector<std::byte> buffer(kPiece);
      for (size_t p; (p = next.fetch_add(1)) < pieces.size();) {
        if (::pread(fds[pieces[p].file], buffer.data(), pieces[p].length,
                    static_cast<off_t>(pieces[p].offset)) != static_cast<ssize_t>(pieces[p].length)) {
          Die(loadstone::Status::IOError("short read"));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int fd : fds) ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: torch_bench load|state_dict|into_fresh|into_allocated|libtorch|raw_read MODEL\n";
    return 2;
  }
  const std::string method = argv[1], path = argv[2];
  auto ckpt = loadstone::Checkpoint::Open(path);
  if (!ckpt.ok()) Die(ckpt.status());
  std::shared_ptr<torch::nn::Module> model;
  if (method == "into_fresh" || method == "into_allocated" || method == "libtorch" ||
      method == "state_dict_beside_model") {
    model = Skeleton(*ckpt);
  }

  const auto start = Clock::now();
  if (method == "load") {
    auto plan = loadstone::Plan(*ckpt);
    if (!plan.ok()) Die(plan.status());
    loadstone::Loader loader;
    loadstone::LoadHandle load = loader.Load(*ckpt, *plan);
    if (auto s = load.Done().get(); !s.ok()) Die(s);
  } else if (method == "state_dict" || method == "state_dict_beside_model") {
    auto sd = loadstone::libtorch::LoadStateDict(path);
    if (!sd.ok()) Die(sd.status());
  } else if (method == "into_fresh" || method == "into_allocated") {
    loadstone::libtorch::TorchLoadOptions opt;
    opt.copy_into_parameters = method == "into_allocated";
    if (const char* depth = std::getenv("TORCH_BENCH_QUEUE_DEPTH")) {  // a knob for experiments
      opt.loader = std::make_shared<loadstone::Loader>(
          loadstone::LoaderOptions{.queue_depth = std::atoi(depth)});
    }
    auto report = loadstone::libtorch::LoadInto(*model, path, opt);
    if (!report.ok()) Die(report.status());
    if (!report->missing_keys.empty() || !report->unexpected_keys.empty()) {
      Die(loadstone::Status::Corruption("the skeleton does not match the checkpoint"));
    }
  } else if (method == "libtorch") {
    PlainLibTorch(*ckpt, *model);
  } else if (method == "raw_read") {
    RawRead(*ckpt);
  } else {
    std::cerr << "unknown method " << method << "\n";
    return 2;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const uint64_t bytes = ckpt->total_bytes();
  std::cout << fmt::format(R"({{"method": "{}", "seconds": {:.6f}, "bytes": {}, "gbps": {:.4f}}})",
                           method, seconds, bytes, bytes / seconds / 1e9)
            << "\n";
  return 0;
}
