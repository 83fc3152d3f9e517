// loadstone load PATH [plan flags] [--backend B] [--json] [--trace FILE] [--mmap]
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"
#include "tools/loadstone/load_flags.h"
#include "tools/loadstone/progress_bar.h"

namespace loadstone::cli {
namespace {

struct LoadArgs {
  LoadFlags flags;
  bool json = false;
  bool mmap = false;
  std::string trace;
};

// zlib's CRC-32 of the tensor's bytes, copied back from its device when it is not on the host.
Result<uint32_t> Crc32(const loadstone::Tensor& t) {
  std::vector<std::byte> host;
  const std::byte* p = t.data();
  if (t.device() != "cpu") {
    host.resize(t.nbytes());
    LOADSTONE_RETURN_IF_ERROR(t.CopyToHost(host));
    p = host.data();
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t left = t.nbytes(); left > 0;) {
    const uInt n = static_cast<uInt>(std::min<uint64_t>(left, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

int RunLoad(const LoadArgs& args) {
  auto ckpt = Checkpoint::Open(args.flags.path, args.flags.open);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  auto plan_options = args.flags.ToPlanOptions();
  if (!plan_options.ok()) return ReportError(plan_options.status());
  auto plan = Plan(*ckpt, *plan_options);
  if (!plan.ok()) return ReportError(plan.status());
  auto loader_options = args.flags.ToLoaderOptions();
  if (!loader_options.ok()) return ReportError(loader_options.status());

  Loader loader(*loader_options);
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int64_t> first_tensor_ns{-1};
  LoadOptions options;
  options.mmap = args.mmap;
  options.trace = !args.trace.empty();
  options.on_tensor = [&](const loadstone::Tensor&) {
    int64_t unset = -1;
    first_tensor_ns.compare_exchange_strong(
        unset, std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - start).count());
  };
  LoadHandle load = loader.Load(*ckpt, *plan, options);
  const Status status = WaitWithProgress(load, /*show=*/!args.json && ::isatty(STDERR_FILENO));
  const Progress progress = load.progress();
  if (!args.trace.empty()) {
    if (Status s = load.WriteTrace(args.trace); !s.ok()) return ReportError(s);
  }
  if (!status.ok()) return ReportError(status);

  const double seconds = progress.seconds;
  const double gbps = seconds > 0 ? plan->read_bytes / seconds / 1e9 : 0;
  const double first_ms = first_tensor_ns.load() / 1e6;
  if (!args.json) {
    std::cout << fmt::format(
        "loaded {} tensors, {} read ({} placed) in {:.3f} s: {:.2f} GB/s, first tensor after "
        "{:.1f} ms\nbackend: {}\n",
        progress.tensors_total, HumanBytes(plan->read_bytes), HumanBytes(plan->placed_bytes),
        seconds, gbps, first_ms, load.backend());
    return 0;
  }
  nlohmann::ordered_json doc;
  doc["bytes"] = plan->read_bytes;
  doc["seconds"] = seconds;
  doc["gbps"] = gbps;
  doc["backend"] = load.backend();
  doc["first_tensor_ms"] = first_ms;
  const ReadStats rs = load.read_stats();
  doc["read"] = {{"direct_bytes", rs.direct_bytes},
                 {"buffered_bytes", rs.buffered_bytes},
                 {"bounced_bytes", rs.bounced_bytes},
                 {"resubmits", rs.resubmits},
                 {"cache_copied_bytes", rs.cache_copied_bytes}};
  std::map<std::string, uint64_t> per_device;
  auto& tensors = doc["tensors"] = nlohmann::ordered_json::array();
  for (const loadstone::Tensor& t : load.Tensors()) {
    auto crc = Crc32(t);
    if (!crc.ok()) return ReportError(crc.status());
    per_device[t.device()] += t.nbytes();
    tensors.push_back({{"name", t.name()},
                       {"dtype", SafetensorsName(t.dtype())},
                       {"shape", t.shape()},
                       {"crc32", *crc}});
  }
  auto& devices = doc["devices"] = nlohmann::ordered_json::object();
  for (const auto& [device, bytes] : per_device) {
    devices[device] = {{"bytes", bytes}, {"gbps", seconds > 0 ? bytes / seconds / 1e9 : 0}};
  }
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

void AddLoadCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LoadArgs>();
  CLI::App* cmd = app.add_subcommand("load", "Stream a checkpoint into memory");
  args->flags.Register(cmd);
  cmd->add_flag("--json", args->json, "Print one JSON document (with CRC-32 per tensor)");
  cmd->add_flag("--mmap", args->mmap, "Map tensors that need no conversion instead of reading");
  cmd->add_option("--trace", args->trace, "Write a Chrome trace-event JSON of the load");
  cmd->callback([args, exit_code] { *exit_code = RunLoad(*args); });
}

}  // namespace loadstone::cli
