// Weight updates in place (loadstone/weight_update.h) across processes over c10d on 127.0.0.1: a
// trainer process sends new weights into an engine process whose model LoadInto filled, then an
// update the engine must refuse and a trainer that dies mid-update — the engine ends each with
// every tensor of one version and that version's number; tensor-parallel engine ranks that
// each take their part, checked against transformers' own parts (tests/fixtures/tp/cases.json);
// expert-parallel engine ranks that keep only their experts.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bindings/dist/update_manifest.h"
#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/torch.h"
#include "loadstone/weight_update.h"
#include "testing/fork_ranks.h"
#include "testing/temp_dir.h"
#include "testing/tp_cases.h"

// LibTorch's logging (glog) defines CHECK; the tests mean Catch's.
#undef CHECK
#include <catch2/catch.hpp>

namespace loadstone {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

const std::string kLlama = testing::kTpModels + "llama";

// A module with a parameter of each of the checkpoint's names and shapes (zeros), nested as the
// names are: what LoadInto fills.
std::shared_ptr<torch::nn::Module> ModuleFor(const Checkpoint& ckpt) {
  auto root = std::make_shared<torch::nn::Module>();
  for (const TensorInfo& t : ckpt.tensors()) {
    std::shared_ptr<torch::nn::Module> at = root;
    std::string rest = t.name;
    for (size_t dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const std::string part = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
      auto* child = at->named_children().find(part);
      at = child != nullptr ? *child
                            : at->register_module(part, std::make_shared<torch::nn::Module>());
    }
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    at->register_parameter(rest, torch::zeros(shape), /*requires_grad=*/false);
  }
  return root;
}

// A zero tensor of each of a rank's parts: an engine rank's weights before a load or update.
Named ZerosOf(const RankShare& share) {
  Named parts;
  for (const TensorShard& s : share.tensors) {
    parts.emplace_back(s.name, torch::zeros(std::vector<int64_t>(s.shape.begin(), s.shape.end())));
  }
  return parts;
}

// A process group of `world` ranks on 127.0.0.1 (every rank its own group of one for the
// tensor-parallel exchange, which updates do not use).
std::unique_ptr<ProcessGroups> Connect(int world, int rank, int port) {
  GroupOptions g;
  g.world_size = world;
  g.rank = rank;
  g.master_port = port;
  g.timeout = std::chrono::seconds(8);
  auto groups = ProcessGroups::Connect(g, 1);
  return groups.ok() ? std::move(*groups) : nullptr;
}

// The trainer's weights of version v: the checkpoint's (each element its own index) × v + v.
Named WeightsOf(uint64_t v) {
  auto state = libtorch::LoadStateDict(kLlama);
  Named out;
  if (!state.ok()) return out;
  for (auto& [name, t] : state->tensors) {
    out.emplace_back(name, (t * static_cast<double>(v) + static_cast<double>(v)).contiguous());
  }
  return out;
}

// Passes calls through, and ends the process at the `die_at`th broadcast (a trainer that dies
// mid-update).
class DyingGroups : public ProcessGroups {
 public:
  DyingGroups(ProcessGroups& inner, int die_at) : inner_(inner), die_at_(die_at) {}
  Exchange& exchange() override { return inner_.exchange(); }
  Result<std::vector<uint64_t>> AllGather(uint64_t v) override { return inner_.AllGather(v); }
  const GroupOptions& options() const override { return inner_.options(); }
  Status Broadcast(std::span<std::byte> data, int root) override {
    if (++calls_ == die_at_) _exit(3);
    return inner_.Broadcast(data, root);
  }

 private:
  ProcessGroups& inner_;
  int die_at_;
  int calls_ = 0;
};

void Trainer(int port, const std::string& out) {
  nlohmann::json report;
  auto groups = Connect(2, 0, port);
  if (groups == nullptr) return;
  WeightUpdateOptions options;
  options.bucket_bytes = 512;  // many buckets, even for this small model: the tensors of 256
  options.alone_bytes = 256;   // bytes or more alone, the others packed
  auto sent = SendWeights(*groups, WeightsOf(1), 1, options);
  report["v1"] = sent.ok() ? "OK" : sent.status().ToString();
  Named wrong = WeightsOf(2);
  wrong[3].second = wrong[3].second.flatten();  // a shape the engine does not hold
  sent = SendWeights(*groups, wrong, 2, options);
  report["v2"] = sent.ok() ? "OK" : sent.status().ToString();
  std::ofstream(out) << report.dump();
  // Dies at its fourth broadcast: the manifest's size and text, one bucket, then gone.
  DyingGroups dying(*groups, 4);
  (void)SendWeights(dying, WeightsOf(3), 3, options);
}

// How many live tensors differ from version v's (the checkpoint's for 0: each element its own
// index i; else i·v + v), and the version.
nlohmann::json Check(const LiveWeights& live, uint64_t v) {
  uint64_t wrong = 0;
  auto use = live.Use();
  for (const LiveWeights::Entry& e : live.entries()) {
    const double scale = v == 0 ? 1.0 : static_cast<double>(v);
    const at::Tensor expected =
        torch::arange(e.tensor.numel(), torch::kFloat32).reshape(e.tensor.sizes()) * scale +
        static_cast<double>(v);
    if (!torch::equal(e.tensor, expected)) ++wrong;
  }
  return {{"version", live.version()}, {"tensors_not_of_it", wrong}};
}

void Engine(int port, const std::string& out) {
  nlohmann::json report;
  auto ckpt = Checkpoint::Open(kLlama);
  auto model = ModuleFor(*ckpt);
  auto loaded = libtorch::LoadInto(*model, kLlama);
  auto live = LiveWeights::Of(libtorch::PersistentStateDict(*model));
  auto groups = Connect(2, 1, port);
  if (!loaded.ok() || !live.ok() || groups == nullptr) return;
  report["v0"] = Check(**live, 0);  // as LoadInto filled it
  WeightUpdateOptions options;  // the trainer's options reach the engine in the manifest
  for (const char* step : {"v1", "v2", "v3"}) {
    auto got = ReceiveWeights(*groups, **live, options);
    report[step] = Check(**live, 1);
    report[step]["status"] = got.ok() ? "OK" : got.status().ToString();
  }
  // The parameters are the model's own: what its forward pass would use.
  report["model_is_v1"] =
      torch::equal(model->named_parameters()["lm_head.weight"],
                   torch::arange(18 * 8, torch::kFloat32).reshape({18, 8}) * 1.0 + 1.0);
  std::ofstream(out) << report.dump();
}

TEST_CASE("weight update: a trainer process into an engine LoadInto filled, whole or not at all") {
  testing::TempDir dir;
  const int port = testing::FreshPort(21);
  bool ended = false;
  const double seconds = testing::ForkRanks(2, [&](int r) {
    if (r == 0) Trainer(port, dir.path() + "/trainer");
    if (r == 1) Engine(port, dir.path() + "/engine");
  }, &ended);
  CHECK(ended);
  CHECK(seconds < 40);
  const nlohmann::json trainer = testing::ReadReport(dir.path() + "/trainer");
  const nlohmann::json engine = testing::ReadReport(dir.path() + "/engine");
  INFO(trainer.dump() << "\n" << engine.dump());
  REQUIRE(engine.is_object());
  CHECK(engine["v0"]["tensors_not_of_it"] == 0);  // LoadInto gave the checkpoint's values
  // Version 1 everywhere.
  CHECK(trainer["v1"] == "OK");
  CHECK(engine["v1"]["status"] == "OK");
  CHECK(engine["v1"]["version"] == 1);
  CHECK(engine["v1"]["tensors_not_of_it"] == 0);
  CHECK(engine["model_is_v1"] == true);
  // Version 2 names a tensor of another shape: refused by the engine, told to the trainer, and
  // nothing of it written.
  CHECK_THAT(engine["v2"]["status"].get<std::string>(),
             Catch::Contains("'model.layers.0.mlp.gate_proj.weight' of update version 2 is "
                             "F32 80") &&
                 Catch::Contains("send the engine's dtype and the full shape"));
  CHECK_THAT(trainer["v2"].get<std::string>(), Catch::Contains("rank 1 failed"));
  CHECK(engine["v2"]["version"] == 1);
  CHECK(engine["v2"]["tensors_not_of_it"] == 0);
  // Version 3: the trainer died after one bucket; the engine keeps version 1, whole.
  CHECK(engine["v3"]["status"] != "OK");
  CHECK(engine["v3"]["version"] == 1);
  CHECK(engine["v3"]["tensors_not_of_it"] == 0);
}

// An engine rank of a tensor-parallel pair: its parts of the llama model (zeros), then one update
// from the trainer (rank 0 of 3): its parts must be transformers' parts of the trainer's tensors.
void TpEngine(int rank, int port, const std::string& out) {
  auto ckpt = Checkpoint::Open(kLlama);
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = rank - 1, .tp = 2});
  if (!share.ok()) return;
  Named parts = ZerosOf(*share);
  parts.emplace_back("extra.empty", torch::zeros({0}));
  auto live = LiveWeights::Of(parts, &*share);
  auto groups = Connect(3, rank, port);
  if (!live.ok() || groups == nullptr) return;
  nlohmann::json report;
  auto got = ReceiveWeights(*groups, **live);
  report["status"] = got.ok() ? "OK" : got.status().ToString();
  report["applied_bytes"] = got.ok() ? got->applied_bytes : 0;
  for (const LiveWeights::Entry& e : (*live)->entries()) {
    if (e.tensor.numel() == 0) continue;
    const at::Tensor flat = e.tensor.flatten();
    report["tensors"][e.name] =
        std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  }
  std::ofstream(out) << report.dump();
}

TEST_CASE("weight update: tensor-parallel engine ranks each take transformers' part") {
  testing::TempDir dir;
  const int port = testing::FreshPort(23);
  bool ended = false;
  testing::ForkRanks(3, [&](int r) {
    if (r == 0) {
      auto groups = Connect(3, 0, port);
      auto state = libtorch::LoadStateDict(kLlama);  // each element its own index
      WeightUpdateOptions options;
      options.bucket_bytes = 512;
      options.alone_bytes = 256;
      if (groups == nullptr || !state.ok()) return;
      // An empty tensor between the first two (both sent alone): a bucket of no bytes, which
      // neither side broadcasts.
      Named tensors = state->tensors;
      tensors.insert(tensors.begin() + 1, {"extra.empty", torch::zeros({0})});
      (void)SendWeights(*groups, tensors, 1, options);
      return;
    }
    TpEngine(r, port, dir.path() + "/" + std::to_string(r));
  }, &ended);
  CHECK(ended);
  for (int e : {0, 1}) {
    const nlohmann::json report = testing::ReadReport(dir.path() + "/" + std::to_string(e + 1));
    INFO("engine rank " << e << ": " << report.dump().substr(0, 300));
    REQUIRE(report.is_object());
    REQUIRE(report["status"] == "OK");
    uint64_t bytes = 0;
    for (const auto& param : testing::TpCase("llama")["parameters"]) {
      std::vector<float> expected;
      for (uint64_t i : testing::TpIndices(param, 2, e)) expected.push_back(static_cast<float>(i));
      bytes += expected.size() * 4;
      CHECK(report["tensors"][param["name"].get<std::string>()].get<std::vector<float>>() ==
            expected);
    }
    CHECK(report["applied_bytes"] == bytes);  // its parts only
  }
}

// Expert-parallel engine ranks (tp 2 --ep over the qwen3-moe fixture) take an update of the
// whole model from a trainer (rank 0 of 3): each keeps its experts and its parts, and passes
// over the other rank's experts.
void EpEngine(int rank, int port, const std::string& out) {
  const std::string moe = testing::kTpModels + "qwen3-moe";
  auto ckpt = Checkpoint::Open(moe);
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = rank - 1, .tp = 2,
                                              .expert_parallel = true});
  auto state = libtorch::LoadStateDict(moe);
  if (!share.ok() || !state.ok()) return;
  Named parts = ZerosOf(*share);
  auto live = LiveWeights::Of(parts, &*share);
  auto groups = Connect(3, rank, port);
  if (!live.ok() || groups == nullptr) return;
  nlohmann::json report;
  auto got = ReceiveWeights(*groups, **live);
  report["status"] = got.ok() ? "OK" : got.status().ToString();
  report["applied_bytes"] = got.ok() ? got->applied_bytes : 0;
  report["elsewhere"] = share->elsewhere.size();
  uint64_t wrong = 0;
  uint64_t bytes = 0;
  for (const LiveWeights::Entry& e : (*live)->entries()) {
    at::Tensor full;
    for (const auto& [name, t] : state->tensors) {
      if (name == e.name) full = (t * 2.0 + 1.0).contiguous();
    }
    at::Tensor part = torch::empty_like(e.tensor);
    CopyPartOf(e.cut, share->tp_rank, static_cast<const std::byte*>(full.data_ptr()),
               static_cast<std::byte*>(part.data_ptr()), 4);
    if (!torch::equal(part, e.tensor)) ++wrong;
    bytes += static_cast<uint64_t>(e.tensor.nbytes());
  }
  report["wrong"] = wrong;
  report["held_bytes"] = bytes;
  std::ofstream(out) << report.dump();
}

TEST_CASE("weight update: expert-parallel engines keep their experts, pass over the others'") {
  testing::TempDir dir;
  const int port = testing::FreshPort(25);
  bool ended = false;
  testing::ForkRanks(3, [&](int r) {
    if (r == 0) {
      auto groups = Connect(3, 0, port);
      auto state = libtorch::LoadStateDict(testing::kTpModels + "qwen3-moe");
      if (groups == nullptr || !state.ok()) return;
      Named tensors;
      for (auto& [name, t] : state->tensors) {
        tensors.emplace_back(name, (t * 2.0 + 1.0).contiguous());
      }
      WeightUpdateOptions options;
      options.bucket_bytes = 512;
      options.alone_bytes = 256;
      (void)SendWeights(*groups, tensors, 1, options);
      return;
    }
    EpEngine(r, port, dir.path() + "/" + std::to_string(r));
  }, &ended);
  CHECK(ended);
  for (int e : {1, 2}) {
    const nlohmann::json report = testing::ReadReport(dir.path() + "/" + std::to_string(e));
    INFO("engine rank " << e << ": " << report.dump());
    REQUIRE(report.is_object());
    CHECK(report["status"] == "OK");
    CHECK(report["elsewhere"] == 2 * 2 * 3);  // the other rank's experts: 2 layers × 2 × 3
    CHECK(report["wrong"] == 0);
    CHECK(report["applied_bytes"] == report["held_bytes"]);  // its own tensors only
  }
}

// The tensors of a plain load of `path` (as stored).
std::vector<Tensor> Loaded(const std::string& path) {
  auto ckpt = Checkpoint::Open(path);
  REQUIRE(ckpt.ok());
  auto plan = Plan(*ckpt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle handle = loader.Load(*ckpt, *plan);
  REQUIRE(handle.Done().get().ok());
  return handle.Tensors();
}

TEST_CASE("weight update: from a new checkpoint, all at once, after the engine lets go") {
  Named zeros;
  for (auto& [name, t] : WeightsOf(1)) zeros.emplace_back(name, torch::zeros_like(t));
  auto live = LiveWeights::Of(zeros);
  REQUIRE(live.ok());
  const std::vector<Tensor> fresh = Loaded(kLlama);
  // An engine using the weights holds them: the update waits, then writes all of them.
  std::optional<std::shared_lock<std::shared_mutex>> use((*live)->Use());
  Result<WeightUpdateReport> report = Status::Cancelled("not run");
  std::thread update([&] { report = UpdateFromTensors(**live, fresh, 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (const LiveWeights::Entry& e : (*live)->entries()) {
    CHECK(e.tensor.abs().sum().item<float>() == 0);  // nothing written while it is in use
  }
  use.reset();
  update.join();
  REQUIRE(report.ok());
  CHECK(report->version == 1);
  CHECK((*live)->version() == 1);
  CHECK(Check(**live, 0)["tensors_not_of_it"] == 0);  // the checkpoint's values, every tensor
  // Not past the live version: refused.
  auto stale = UpdateFromTensors(**live, fresh, 1);
  REQUIRE_FALSE(stale.ok());
  CHECK_THAT(std::string(stale.status().message()), Catch::Contains("must advance it"));
  // Another model's tensors (down_proj [8, 16], not [8, 10]): refused, nothing written, even
  // of the tensors that fit.
  auto other = UpdateFromTensors(**live, Loaded(testing::kTpModels + "by-hand"), 2);
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(std::string(other.status().message()), Catch::Contains("nothing of version 2"));
  CHECK((*live)->version() == 1);
  CHECK(Check(**live, 0)["tensors_not_of_it"] == 0);
}

TEST_CASE("weight update: a read-once share's replicated tensors are whole to an engine") {
  auto ckpt = Checkpoint::Open(kLlama);
  REQUIRE(ckpt.ok());
  auto share = ShareOf(*ckpt, ParallelOptions{.world_size = 2, .rank = 1, .tp = 2,
                                              .read_mode = ReadMode::kOnce});
  REQUIRE(share.ok());
  Named parts = ZerosOf(*share);
  auto live = LiveWeights::Of(parts, &*share);
  REQUIRE(live.ok());
  // Read once sends a replicated tensor as a split whose every part is all of it: the engine
  // takes it whole (received straight into its staging), a split one as its part.
  CHECK((*live)->Find("model.norm.weight")->cut.dim == -1);
  CHECK((*live)->Find("model.layers.0.self_attn.q_proj.weight")->cut.dim == 0);
}

TEST_CASE("weight update: staging memory that cannot be had is an error, not an exception") {
  auto live = LiveWeights::Of(Named{{"w", torch::zeros({4})}});
  REQUIRE(live.ok());
  auto huge = (*live)->Staging(uint64_t{1} << 62);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kOutOfMemory);
  CHECK_THAT(std::string(huge.status().message()), Catch::Contains("stage a weight update"));
  auto small = (*live)->Staging(64);  // and the engine can still stage an update after it
  REQUIRE(small.ok());
  CHECK(*small != nullptr);
}

// One rank alone: its broadcasts go nowhere.
class AloneGroups : public ProcessGroups {
 public:
  Exchange& exchange() override { std::abort(); }
  Result<std::vector<uint64_t>> AllGather(uint64_t v) override {
    return std::vector<uint64_t>{v};
  }
  Status Broadcast(std::span<std::byte>, int) override { return Status::OK(); }
  const GroupOptions& options() const override { return options_; }

 private:
  GroupOptions options_;  // rank 0
};

TEST_CASE("weight update: a trainer whose manifest is too large is told so, in its own words") {
  AloneGroups alone;
  auto sent = dist::BroadcastManifest(alone, 0, std::string((64 << 20) + 1, ' '));
  REQUIRE_FALSE(sent.ok());
  CHECK_THAT(std::string(sent.status().message()),
             Catch::Contains("manifest is 67108865 bytes") &&
                 Catch::Contains("send the tensors in several updates"));
}

TEST_CASE("weight update: a manifest that is not one is refused, bounded") {
  auto ok = dist::ManifestOf(WeightsOf(1), 4, WeightUpdateOptions());
  REQUIRE(ok.ok());
  auto back = dist::FromJson(dist::ToJson(*ok));
  REQUIRE(back.ok());
  CHECK(back->version == 4);
  CHECK(back->items.size() == ok->items.size());
  CHECK(back->items[0].nbytes == ok->items[0].nbytes);
  for (const char* bad : {
           "", "[]", "{\"version\": 1}", "not json",
           R"({"version": 1, "bucket_bytes": 0, "alone_bytes": 1, "tensors": []})",
           R"({"version": 1, "bucket_bytes": 8, "alone_bytes": 1, "tensors": [["a", "Q9", [1]]]})",
           R"({"version": -1, "bucket_bytes": 8, "alone_bytes": 1, "tensors": []})",
           // a name twice (it would be staged twice), a shape of 17 dimensions
           R"({"version": 1, "bucket_bytes": 8, "alone_bytes": 1,
               "tensors": [["a", "F32", [1]], ["a", "F32", [1]]]})",
           R"({"version": 1, "bucket_bytes": 8, "alone_bytes": 1,
               "tensors": [["a", "F32", [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]]]})",
           // 2^40 × 2^40 elements: refused before anything is sized by it
           R"({"version": 1, "bucket_bytes": 8, "alone_bytes": 1,
               "tensors": [["a", "F32", [1099511627776, 1099511627776]]]})"}) {
    INFO(bad);
    auto m = dist::FromJson(bad);
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(std::string(m.status().message()), Catch::Contains("manifest is malformed"));
  }
}

}  // namespace
}  // namespace loadstone
