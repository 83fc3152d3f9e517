// A checkpoint file behind an http:// address, served from the committed fixtures by nginx on
// 127.0.0.1 (started and stopped here): its catalog is the local file's, and every tensor loads
// byte-equal to the local load (safetensors, quantized safetensors dequantized on load, GGUF, a
// torch .bin), cast too; an object replaced between Open and Load fails the load naming it, and
// the Loader goes on; a folder address and --mmap are refused with what to do.
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "testing/nginx_server.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::NginxServer;
using testing::TempDir;
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures";

std::unique_ptr<NginxServer> Serve(const std::string& root) {
  std::string why;
  auto server = NginxServer::Start(root, &why);
  if (!server) WARN("skipped: " << why);
  return server;
}

// Every tensor of `checkpoint` loaded with `options`: name → bytes; fails the test on an error.
std::map<std::string, std::vector<std::byte>> LoadAll(Loader& loader, const Checkpoint& checkpoint,
                                                      const PlanOptions& options) {
  auto plan = Plan(checkpoint, options);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  LoadHandle load = loader.Load(checkpoint, *plan);
  const Status done = load.Done().get();
  INFO(done.ToString());
  REQUIRE(done.ok());
  std::map<std::string, std::vector<std::byte>> out;
  for (const TensorPlan& tp : plan->tensors) {
    const std::string& name = checkpoint.tensors()[tp.source].name;
    const Tensor& t = load.Tensor(name).get();
    out[name].assign(t.data(), t.data() + t.nbytes());
  }
  return out;
}

TEST_CASE("remote: a file behind an http address catalogs and loads as the local one does",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  Loader loader;
  struct Case {
    std::string path;
    PlanOptions options;
  };
  PlanOptions bf16;
  bf16.dtype = DType::kBF16;
  const std::vector<Case> cases = {
      {"safetensors/dtypes.safetensors", {}},
      {"safetensors/unicode_names.safetensors", {}},
      {"safetensors/dtypes.safetensors", bf16},  // cast on the workers, through staging
      {"bnb/bnb4.safetensors", {}},              // dequantized on load
      {"ct/pack.safetensors", {}},
      {"gguf/quantized.gguf", {}},
      {"gguf/plain.gguf", {}},
      {"torch/parameters.bin", {}},
  };
  for (const Case& c : cases) {
    INFO(c.path);
    auto local = Checkpoint::Open((kFixtures / c.path).string());
    REQUIRE(local.ok());
    auto remote = Checkpoint::Open(server->Url(c.path));
    INFO(remote.status().ToString());
    REQUIRE(remote.ok());
    REQUIRE(remote->tensors().size() == local->tensors().size());
    for (size_t i = 0; i < local->tensors().size(); ++i) {
      const TensorInfo& l = local->tensors()[i];
      const TensorInfo& r = remote->tensors()[i];
      CHECK(r.name == l.name);
      CHECK(r.dtype == l.dtype);
      CHECK(r.shape == l.shape);
      CHECK(r.offset == l.offset);
    }
    CHECK(remote->files()[0].path == server->Url(c.path));
    CHECK_FALSE(remote->files()[0].stamp.validator.empty());
    const auto want = LoadAll(loader, *local, c.options);
    const auto got = LoadAll(loader, *remote, c.options);
    REQUIRE(got.size() == want.size());
    for (const auto& [name, bytes] : want) {
      INFO(name);
      CHECK(got.at(name) == bytes);
    }
  }
}

TEST_CASE("remote: an object replaced between Open and Load fails the load, and what is refused",
          "[pipeline][http]") {
  TempDir root;
  const fs::path source = kFixtures / "safetensors/dtypes.safetensors";
  fs::copy_file(source, root.Path("m.safetensors"));
  auto server = Serve(root.path());
  if (!server) return;
  auto ckpt = Checkpoint::Open(server->Url("m.safetensors"));
  REQUIRE(ckpt.ok());
  auto plan = Plan(*ckpt);
  REQUIRE(plan.ok());
  // Rewritten with another modification time: nginx's ETag is another.
  fs::remove(root.Path("m.safetensors"));
  fs::copy_file(source, root.Path("m.safetensors"));
  fs::last_write_time(root.Path("m.safetensors"),
                      fs::last_write_time(source) - std::chrono::hours(24));
  Loader loader;
  LoadHandle load = loader.Load(*ckpt, *plan);
  const Status failed = load.Done().get();
  INFO(failed.ToString());
  CHECK(failed.code() == StatusCode::kCorruption);
  CHECK(failed.message().find("changed since its header was read") != std::string::npos);
  CHECK(failed.message().find(server->Url("m.safetensors")) != std::string::npos);
  // The Loader goes on: the object as it is now loads.
  auto again = Checkpoint::Open(server->Url("m.safetensors"));
  REQUIRE(again.ok());
  CHECK(LoadAll(loader, *again, {}).size() == again->tensors().size());

  auto folder = Checkpoint::Open(server->Url(""));
  CHECK(folder.status().code() == StatusCode::kUnsupported);
  CHECK(folder.status().message().find("give the file's address") != std::string::npos);
  auto missing = Checkpoint::Open(server->Url("nope.safetensors"));
  CHECK(missing.status().code() == StatusCode::kNotFound);
  PlanOptions mapped;
  mapped.routes.mmap = true;
  auto mapped_plan = Plan(*again, mapped);
  if (mapped_plan.ok()) {
    const Status refused = loader.Load(*again, *mapped_plan).Done().get();
    CHECK(refused.code() == StatusCode::kInvalidArgument);
    CHECK(refused.message().find("--mmap cannot map") != std::string::npos);
  }
}

}  // namespace
}  // namespace loadstone
