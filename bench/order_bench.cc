// Serving latency (issue 34's must-show; docs/pipeline.md, "Order"), on a Llama-shaped
// checkpoint stored as safetensors stores it (the 40-layer model of bench/run_cpu_bench.sh):
//
//   order_bench MODEL [--rounds 3] [--heads 32] [--modes execution,file,...] [--out FILE]
//
// Cold (each file's pages dropped with posix_fadvise(DONTNEED) before every load), all CPU, all
// through one Loader, in two shuffled loops of rounds — the three orders with nothing else in
// memory, then the two LibTorch modes beside their two bf16 models:
//   - execution: Load in execution order; each module's ready time (OnModules), the total;
//   - file: Load in file order (as stored), the total;
//   - prioritize: Load in execution order, Prioritize(the last module) at once; its ready time;
//   - load: libtorch::LoadInto of a Llama module (examples/forward_while_loading/llama.h), alone;
//   - forward: libtorch::StartLoadInto of the same and its forward pass layer by layer as each
//     layer lands; until the logits are out.
// Prints one JSON document: each mode's times, and the ratios the issue asks for — every module
// k ready by (its cumulative share of the bytes) × the full load's time + 2%, execution
// throughput ≥ 0.98× file order's, the prioritized module in ≤ 10% of the full load, load +
// forward ≤ 1.1× the load alone — with the logits of the streamed forward bit-identical to those
// after a whole load.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "examples/forward_while_loading/llama.h"
#include "loadstone/torch.h"

namespace {

using Clock = std::chrono::steady_clock;
using loadstone::Status;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::cerr << "order_bench: " << what << ": " << s << "\n";
    std::exit(1);
  }
}

void DropCache(const loadstone::Checkpoint& ckpt) {
  for (const auto& f : ckpt.files()) {
    const int fd = ::open(f.path.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The Llama the checkpoint's shapes describe (heads of 64 by default: `heads` of them).
llama::Config ConfigOf(const loadstone::Checkpoint& ckpt, int64_t heads) {
  llama::Config c;
  const auto& embed = ckpt.Find("model.embed_tokens.weight")->shape;
  c.vocab = static_cast<int64_t>(embed[0]);
  c.hidden = static_cast<int64_t>(embed[1]);
  c.intermediate = static_cast<int64_t>(ckpt.Find("model.layers.0.mlp.up_proj.weight")->shape[0]);
  while (ckpt.Find(fmt::format("model.layers.{}.mlp.up_proj.weight", c.layers))) ++c.layers;
  c.heads = heads;
  c.head_dim = c.hidden / heads;
  c.kv_heads = static_cast<int64_t>(ckpt.Find("model.layers.0.self_attn.k_proj.weight")->shape[0]) /
               c.head_dim;
  return c;
}

struct Timings {
  double total = 0;
  std::vector<double> module_ready;  // per plan module (execution mode)
  double prioritized = 0;
};

Timings TimedLoad(loadstone::Loader& loader, const loadstone::Checkpoint& ckpt,
                  const loadstone::LoadPlan& plan, bool prioritize) {
  Timings t;
  t.module_ready.resize(plan.modules.size());
  std::mutex mu;
  size_t next = 0;
  const auto start = Clock::now();
  loadstone::LoadHandle load = loader.Load(ckpt, plan);
  if (prioritize) Check(load.Prioritize(plan.modules.back().prefix), "prioritize");
  Check(load.OnModules([&](const loadstone::PlanModule&, Status s) {
          std::lock_guard lock(mu);
          if (s.ok()) t.module_ready[next++] = Since(start);
        }),
        "on modules");
  if (prioritize) {
    Check(load.Module(plan.modules.back().prefix).get(), "the prioritized module");
    t.prioritized = Since(start);
  }
  Check(load.Done().get(), "load");
  t.total = Since(start);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: order_bench MODEL [--rounds N] [--heads H] [--out FILE]\n";
    return 2;
  }
  const std::string model_path = argv[1];
  int rounds = 3;
  int64_t heads = 32;
  std::string out, only;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rounds") rounds = std::stoi(argv[i + 1]);
    if (flag == "--heads") heads = std::stoll(argv[i + 1]);
    if (flag == "--out") out = argv[i + 1];
    if (flag == "--modes") only = argv[i + 1];
  }
  auto ckpt = loadstone::Checkpoint::Open(model_path);
  Check(ckpt.status(), "open");
  loadstone::PlanOptions by_file;
  by_file.order = loadstone::TensorOrder::kFile;
  auto execution = loadstone::Plan(*ckpt);
  auto file = loadstone::Plan(*ckpt, by_file);
  Check(execution.status(), "plan");
  Check(file.status(), "plan --order file");
  auto loader = std::make_shared<loadstone::Loader>();
  std::map<std::string, std::vector<double>> times;
  std::vector<std::vector<double>> ready;
  std::vector<double> prioritized;
  std::mt19937 shuffle(7);
  auto wanted = [&](std::vector<std::string> modes) {  // --modes a,b: a subset
    if (!only.empty()) {
      std::erase_if(modes, [&](const std::string& m) { return only.find(m) == std::string::npos; });
    }
    return modes;
  };
  // Phase 1, the orders: nothing else in memory.
  std::vector<std::string> modes = wanted({"execution", "file", "prioritize"});
  for (int round = 0; round < rounds && !modes.empty(); ++round) {
    std::shuffle(modes.begin(), modes.end(), shuffle);
    for (const std::string& mode : modes) {
      DropCache(*ckpt);
      const auto& plan = mode == "file" ? *file : *execution;
      const Timings t = TimedLoad(*loader, *ckpt, plan, mode == "prioritize");
      times[mode].push_back(t.total);
      if (mode == "execution") ready.push_back(t.module_ready);
      if (mode == "prioritize") prioritized.push_back(t.prioritized);
    }
  }
  // Phase 2, a forward pass while loading against the load alone, both through the LibTorch
  // face into bf16 Llama modules (made once: each load replaces their tensors).
  const llama::Config config = ConfigOf(*ckpt, heads);
  torch::NoGradGuard no_grad;
  llama::ForCausalLM whole(config), streamed(config);
  whole->to(torch::kBFloat16);
  streamed->to(torch::kBFloat16);
  loadstone::libtorch::TorchLoadOptions topt;
  topt.loader = loader;
  topt.dtype = torch::kBFloat16;
  const torch::Tensor ids = torch::tensor({{1, 2, 3, 4, 5, 6, 7, 8}}, torch::kLong);
  bool identical = true;
  modes = wanted({"load", "forward"});
  for (int round = 0; round < rounds && !modes.empty(); ++round) {
    std::shuffle(modes.begin(), modes.end(), shuffle);
    torch::Tensor whole_logits, streamed_logits;
    for (const std::string& mode : modes) {
      DropCache(*ckpt);
      const auto start = Clock::now();
      if (mode == "load") {
        Check(loadstone::libtorch::LoadInto(*whole, model_path, topt).status(), "LoadInto");
        times[mode].push_back(Since(start));
        whole_logits = whole->Forward(ids);
        continue;
      }
      auto load = loadstone::libtorch::StartLoadInto(*streamed, model_path, topt);
      Check(load.status(), "StartLoadInto");
      Check((*load)->Module("model.embed_tokens").get(), "embeddings");
      torch::Tensor x = streamed->Embed(ids);
      for (int64_t k = 0; k < config.layers; ++k) {
        Check((*load)->Module(fmt::format("model.layers.{}", k)).get(), "layer");
        x = streamed->Layer(k, x);
      }
      Check((*load)->Module("model.norm").get(), "norm");
      Check((*load)->Module("lm_head").get(), "head");
      streamed_logits = streamed->Head(x);
      times[mode].push_back(Since(start));
      Check((*load)->Finish().status(), "Finish");
    }
    if (whole_logits.defined() && streamed_logits.defined()) {
      identical = identical && torch::equal(whole_logits, streamed_logits);
    }
  }

  // Every module k ready by its cumulative share of the bytes × the load's time, + 2%.
  const auto& plan = *execution;
  double placed = 0, worst = -1;
  std::string worst_module;
  nlohmann::ordered_json modules = nlohmann::ordered_json::array();
  std::vector<double> cumulative;
  for (const auto& m : plan.modules) {
    for (uint32_t t = m.first; t < m.end; ++t) placed += double(plan.tensors[t].nbytes);
    cumulative.push_back(placed);
  }
  for (size_t k = 0; k < plan.modules.size(); ++k) {
    std::vector<double> at;
    for (size_t r = 0; r < ready.size(); ++r) at.push_back(ready[r][k] / times["execution"][r]);
    const double share = cumulative[k] / placed, late = Median(at) - share;
    if (late > worst) worst = late, worst_module = plan.modules[k].prefix;
    modules.push_back({{"prefix", plan.modules[k].prefix}, {"bytes_share", share},
                       {"ready_share", Median(at)}});
  }
  nlohmann::ordered_json doc;
  doc["model"] = model_path;
  doc["date"] = "2026-12-06";
  doc["rounds"] = rounds;
  doc["bytes"] = plan.placed_bytes;
  for (const auto& [mode, v] : times) doc["seconds"][mode] = v;
  doc["prioritized_seconds"] = prioritized;
  doc["modules"] = modules;
  const double exec = Median(times["execution"]);
  doc["checks"] = {
      {"worst_module_lateness", worst},
      {"worst_module", worst_module},
      {"every_module_within_2pct", worst <= 0.02},
      {"execution_vs_file_throughput", Median(times["file"]) / exec},
      {"prioritized_share_of_load", Median(prioritized) / Median(times["prioritize"])},
      {"forward_while_loading_vs_load", Median(times["forward"]) / Median(times["load"])},
      {"logits_identical", identical},
  };
  const std::string text = doc.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) {
    std::ofstream(out + ".tmp") << text << "\n";
    std::rename((out + ".tmp").c_str(), out.c_str());
  }
  return 0;
}
