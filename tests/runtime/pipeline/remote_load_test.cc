// Checkpoints behind http:// and hf:// addresses, served from the committed fixtures by nginx
// on 127.0.0.1 (started and stopped here): a file's catalog is the local file's, and every
// tensor loads byte-equal to the local load (safetensors, quantized safetensors dequantized on
// load, GGUF, a torch .bin), cast too; folders behind a base URL — sharded, variants,
// subfolders, .bin shards, a GGUF split set, GPTQ whose config.json says how to decode — and
// the same through the Hub's resolve/ route (its token, its 302 to the CDN, its linked ETag)
// load as their local folders do, over https with HTTP/2 too (the CA from CURL_CA_BUNDLE, a
// clear error without it); through a fault proxy, transient faults are retried and the
// load is byte-equal, a 403 fails the load naming the tensor and the URL; an object replaced
// between Open and Load fails the load naming it, and the Loader goes on; --mmap is refused
// with what to do.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "runtime/pipeline/load_hooks.h"
#include "testing/fault_proxy.h"
#include "testing/nginx_server.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::NginxServer;
using testing::ScopedEnv;
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

// `remote` holds what `local` does, tensor for tensor, and loads byte-equal to it.
void CheckSame(Loader& loader, const Checkpoint& local, const Checkpoint& remote,
               const PlanOptions& options = {}) {
  REQUIRE(remote.tensors().size() == local.tensors().size());
  REQUIRE(remote.files().size() == local.files().size());
  for (size_t i = 0; i < local.tensors().size(); ++i) {
    const TensorInfo& l = local.tensors()[i];
    const TensorInfo& r = remote.tensors()[i];
    CHECK(r.name == l.name);
    CHECK(r.dtype == l.dtype);
    CHECK(r.shape == l.shape);
    CHECK(r.offset == l.offset);
  }
  const auto want = LoadAll(loader, local, options);
  const auto got = LoadAll(loader, remote, options);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, bytes] : want) {
    INFO(name);
    CHECK(got.at(name) == bytes);
  }
}

// A file's bytes (through its links).
std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A folder of the fixtures and how it is opened.
struct FolderCase {
  std::string path;  // under the fixtures: a folder (or a GGUF split's first file)
  std::string variant, subfolder;
};

const std::vector<FolderCase> kFolders = {
    {"safetensors/sharded", "", ""},
    {"safetensors/variant", "", ""},
    {"safetensors/variant", "fp16", ""},
    {"safetensors/variant_sharded", "fp16", ""},
    {"safetensors/diffusers", "", "unet"},
    {"safetensors/diffusers", "fp16", "vae"},
    {"safetensors/diffusers", "", "text_encoder"},
    {"torch/sharded", "", ""},
    {"torch/variant", "fp16", ""},
    {"bnb/sharded", "", ""},
    {"gptq/gptq4_g32", "", ""},
    {"gptq/awq4_g32", "", ""},
    {"gguf/split/model-00002-of-00003.gguf", "", ""},
};

// The folder case opened from `where` (a path or an address), the test failed on an error.
Checkpoint OpenCase(const std::string& where, const FolderCase& c) {
  OpenOptions options;
  options.variant = c.variant;
  options.subfolder = c.subfolder;
  auto opened = Checkpoint::Open(where, options);
  INFO(where << ": " << opened.status().ToString());
  REQUIRE(opened.ok());
  return std::move(opened).value();
}

TEST_CASE("remote: folders behind a base URL resolve, catalog and load as the local folders do",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  Loader loader;
  for (const FolderCase& c : kFolders) {
    INFO(c.path << " variant '" << c.variant << "' subfolder '" << c.subfolder << "'");
    const Checkpoint local = OpenCase((kFixtures / c.path).string(), c);
    const Checkpoint remote = OpenCase(server->Url(c.path), c);
    CHECK(remote.config().quant_method == local.config().quant_method);
    CHECK(remote.config().bits == local.config().bits);
    CHECK(remote.config().path.empty() == local.config().path.empty());
    CHECK(remote.warnings().size() == local.warnings().size());
    CheckSame(loader, local, remote);
  }
  // Nothing there: the names asked for, and what to try.
  auto empty = Checkpoint::Open(server->Url("safetensors/edge"));
  CHECK(empty.status().code() == StatusCode::kNotFound);
  CHECK(empty.status().message().find("model.safetensors.index.json") != std::string::npos);
  CHECK(empty.status().message().find("--variant") != std::string::npos);
  // A shard the index names that is not there.
  TempDir root;
  for (const auto& e : fs::directory_iterator(kFixtures / "safetensors/sharded")) {
    if (e.path().filename() != "model-00002-of-00003.safetensors") {
      fs::copy_file(e.path(), root.Path(e.path().filename().string()));
    }
  }
  auto other = Serve(root.path());
  REQUIRE(other);
  auto gap = Checkpoint::Open(other->Url(""));
  CHECK(gap.status().code() == StatusCode::kNotFound);
  CHECK(gap.status().message().find("shard '" + other->Url("model-00002-of-00003.safetensors") +
                                    "' named by index") != std::string::npos);
}

TEST_CASE("remote: through a fault proxy, a sharded load retries what is transient and fails "
          "on a 403 naming the tensor", "[pipeline][http][faults]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  using testing::Fault;
  std::string why;
  auto proxy = testing::FaultProxy::Start(server->port(), {}, &why);
  REQUIRE(proxy);
  const std::string folder = "safetensors/sharded";
  const Checkpoint local = OpenCase((kFixtures / folder).string(), {});
  const Checkpoint remote = OpenCase(proxy->Url(folder), {});
  Loader loader;
  auto plan = Plan(remote, {});
  REQUIRE(plan.ok());
  // The load's own probes (one per shard, two retried), then its ranges, meet these.
  proxy->Schedule({Fault::kUnavailable, Fault::kReset, Fault::kNone, Fault::kNone, Fault::kNone,
                   Fault::kTruncate, Fault::kReset, Fault::kUnavailable});
  LoadHandle load = loader.Load(remote, *plan);
  const Status done = load.Done().get();
  INFO(done.ToString());
  REQUIRE(done.ok());
  CHECK(proxy->faults_served() == 5);
  const auto want = LoadAll(loader, local, {});
  for (const auto& [name, bytes] : want) {
    const Tensor& t = load.Tensor(name).get();
    CHECK(std::vector<std::byte>(t.data(), t.data() + t.nbytes()) == bytes);
  }
  // The probes' retries are the probe's own; the ranges' are counted.
  CHECK(load.read_stats().resubmits == 3);
  CHECK(load.read_stats().network_bytes > 0);

  // Past the probes, every range is refused: the load fails naming a tensor and the URL.
  std::vector<Fault> schedule(remote.files().size(), Fault::kNone);
  schedule.resize(schedule.size() + 64, Fault::kForbidden);
  proxy->Schedule(schedule);
  const Status refused = loader.Load(remote, *plan).Done().get();
  INFO(refused.ToString());
  CHECK(refused.code() == StatusCode::kIOError);
  CHECK(refused.message().find("loading tensor") != std::string::npos);
  CHECK(refused.message().find("HTTP 403") != std::string::npos);
  CHECK(refused.message().find(proxy->Url(folder)) != std::string::npos);
  proxy->Schedule({});
  CHECK(LoadAll(loader, remote, {}) == want);  // the Loader goes on
}

TEST_CASE("remote: https with HTTP/2, the certificate's authority from CURL_CA_BUNDLE",
          "[pipeline][http]") {
  std::string why;
  auto server = NginxServer::Start(kFixtures.string(), &why, /*tls=*/true);
  if (!server) {
    WARN("skipped: " << why);
    return;
  }
  ScopedEnv curl_ca("CURL_CA_BUNDLE", std::nullopt);
  ScopedEnv requests_ca("REQUESTS_CA_BUNDLE", std::nullopt);
  ScopedEnv ssl_cert("SSL_CERT_FILE", std::nullopt);
  auto untrusted = Checkpoint::Open(server->TlsUrl("safetensors/sharded"));
  CHECK(untrusted.status().code() == StatusCode::kIOError);
  CHECK(untrusted.status().message().find("certificate") != std::string::npos);
  CHECK(untrusted.status().message().find("CURL_CA_BUNDLE") != std::string::npos);

  curl_ca.Set(server->cert_path());
  Loader loader;
  {
    const Checkpoint remote = OpenCase(server->TlsUrl("safetensors/sharded"), {});
    auto plan = Plan(remote, {});
    REQUIRE(plan.ok());
    LoadHandle load = loader.Load(remote, *plan);
    REQUIRE(load.Done().get().ok());
    CHECK(load.backend().find("http (libcurl ") == 0);
    CHECK(load.backend().find(", HTTP/2, ") != std::string::npos);  // libcurl's default for https
  }
  for (const FolderCase& c : {FolderCase{"safetensors/sharded", "", ""},
                              FolderCase{"gguf/split/model-00001-of-00003.gguf", "", ""}}) {
    INFO(c.path);
    CheckSame(loader, OpenCase((kFixtures / c.path).string(), c),
              OpenCase(server->TlsUrl(c.path), c));
  }
}

TEST_CASE("remote: hf:// addresses resolve through the Hub's resolve/ route, with its token",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  TempDir home;  // no token file of the user's is read
  ScopedEnv endpoint("HF_ENDPOINT", server->Url("hub"));
  ScopedEnv hf_home("HF_HOME", home.path());
  ScopedEnv old_token("HUGGING_FACE_HUB_TOKEN", std::nullopt);
  ScopedEnv token("HF_TOKEN", std::nullopt);
  auto refused = Checkpoint::Open("hf://test/fixtures/safetensors/sharded");
  CHECK(refused.status().code() == StatusCode::kIOError);
  CHECK(refused.status().message().find("HTTP 401") != std::string::npos);
  CHECK(refused.status().message().find("check the token") != std::string::npos);

  token.Set(testing::kHubToken);
  Loader loader;
  for (const FolderCase& c : kFolders) {
    INFO(c.path << " variant '" << c.variant << "' subfolder '" << c.subfolder << "'");
    const Checkpoint local = OpenCase((kFixtures / c.path).string(), c);
    const Checkpoint hub = OpenCase("hf://test/fixtures/" + c.path, c);
    CHECK(hub.config().path.empty() == local.config().path.empty());
    // A folder is pinned to the commit its first answer named; a file address is as given. The
    // weights' version is the Hub's linked ETag, the same whichever CDN node answers.
    const std::string first = hub.files()[0].path;
    const std::string root = server->Url(fmt::format(
        "hub/test/fixtures/resolve/{}/", c.path.ends_with(".gguf") ? "main" : testing::kHubCommit));
    CHECK(first.starts_with(root));
    CHECK(hub.files()[0].stamp.validator ==
          "\"linked-" + fs::path(first).filename().string() + "\"");
    CheckSame(loader, local, hub);
  }
  const Checkpoint file = OpenCase("hf://test/fixtures/safetensors/dtypes.safetensors", {});
  CheckSame(loader, OpenCase((kFixtures / "safetensors/dtypes.safetensors").string(), {}), file);
  auto revision = Checkpoint::Open("hf://test/fixtures@v0/safetensors/sharded");
  CHECK(revision.status().code() == StatusCode::kNotFound);
  CHECK(revision.status().message().find("/resolve/v0/safetensors/sharded") != std::string::npos);
  auto malformed = Checkpoint::Open("hf://just-a-name");
  CHECK(malformed.status().code() == StatusCode::kInvalidArgument);
  CHECK(malformed.status().message().find("hf://ORG/REPO") != std::string::npos);
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
    CHECK(remote->files()[0].path == server->Url(c.path));
    CHECK_FALSE(remote->files()[0].stamp.validator.empty());
    CheckSame(loader, *local, *remote, c.options);
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

// The test Hub on `server` for a cache test: HF_ENDPOINT, its token, a fresh HF_HOME and
// HF_HUB_CACHE (`cache`), online.
struct CachingHub {
  explicit CachingHub(const NginxServer& server)
      : endpoint("HF_ENDPOINT", server.Url("hub")),
        hf_home("HF_HOME", home.path()),
        hub_cache("HF_HUB_CACHE", cache.path()),
        token("HF_TOKEN", testing::kHubToken) {}
  TempDir home, cache;
  ScopedEnv endpoint, hf_home, hub_cache, token;
  ScopedEnv online{"HF_HUB_OFFLINE", std::nullopt}, online_too{"TRANSFORMERS_OFFLINE", std::nullopt};
};

TEST_CASE("remote: --cache writes the Hub's files into the Hugging Face cache as they stream",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  const CachingHub hub_env(*server);
  const TempDir& cache = hub_env.cache;
  const Checkpoint hub = OpenCase("hf://test/fixtures/safetensors/sharded", {});
  auto plan = Plan(hub, {});
  REQUIRE(plan.ok());
  Loader loader;
  LoadOptions options;
  options.hub_cache = cache.path();
  LoadHandle load = loader.Load(hub, *plan, options);
  INFO(load.Done().get().ToString());
  REQUIRE(load.Done().get().ok());
  const std::string said = load.read_stats().cache;
  INFO(said);
  CHECK(said.find("cached 4 file(s) of test/fixtures") != std::string::npos);
  CHECK(said.find("left out") == std::string::npos);
  const fs::path repo = fs::path(cache.path()) / "models--test--fixtures";
  const fs::path snapshot = repo / "snapshots" / testing::kHubCommit / "safetensors/sharded";
  std::ifstream ref(repo / "refs/main");
  std::string commit;
  ref >> commit;
  CHECK(commit == testing::kHubCommit);
  // Every file the load named, whole and byte-equal, behind a relative link into blobs/.
  for (const char* name : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", "model.safetensors.index.json"}) {
    INFO(name);
    REQUIRE(fs::is_symlink(snapshot / name));
    CHECK(fs::read_symlink(snapshot / name).string().starts_with("../../../../blobs/"));
    CHECK(Slurp(snapshot / name) ==
          Slurp(kFixtures / "safetensors/sharded" / name));
  }
  CHECK(fs::read_symlink(snapshot / "model-00001-of-00003.safetensors").filename() ==
        "linked-model-00001-of-00003.safetensors");
  for (const auto& entry : fs::directory_iterator(repo / "blobs")) {
    CHECK(entry.path().string().find("loadstone-part") == std::string::npos);
  }
  // The cached folder loads locally, as the original.
  CheckSame(loader, OpenCase((kFixtures / "safetensors/sharded").string(), {}),
            OpenCase(snapshot.string(), {}));

  // A local checkpoint with a cache asked for: refused, nothing ignored.
  const Checkpoint local = OpenCase((kFixtures / "safetensors/sharded").string(), {});
  auto local_plan = Plan(local, {});
  REQUIRE(local_plan.ok());
  const Status refused = loader.Load(local, *local_plan, options).Done().get();
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("hf://") != std::string::npos);
}

// How many files (blobs and part files) `repo`'s blobs/ holds; 0 without the folder.
size_t BlobsUnder(const fs::path& repo) {
  if (!fs::exists(repo / "blobs")) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(repo / "blobs"), {}));
}

TEST_CASE("remote: the cache is completed off the Loader's loop, and a cancel stops it",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  const CachingHub hub_env(*server);
  const TempDir& cache = hub_env.cache;
  const Checkpoint hub = OpenCase("hf://test/fixtures/safetensors/sharded", {});
  const Checkpoint local = OpenCase((kFixtures / "safetensors/variant").string(), {});
  auto plan = Plan(hub, {});
  auto local_plan = Plan(local, {});
  REQUIRE(plan.ok());
  REQUIRE(local_plan.ok());
  LoadOptions options;
  options.hub_cache = cache.path();
  const fs::path repo = fs::path(cache.path()) / "models--test--fixtures";

  SECTION("another load on the same Loader runs to its end while the cache is completed") {
    // The hook holds the cache's worker until the other load is done (20 s at most): were the
    // cache completed on the loop, the other load could not end before it.
    std::promise<Status> other_done;
    std::shared_future<Status> other = other_done.get_future().share();
    std::atomic<bool> other_ended_first{false};
    LoadHooks hooks;
    hooks.cancel_at = [&](LoadStage stage) {
      if (stage != LoadStage::kCompletingCache) return false;
      other_ended_first = other.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
      return false;
    };
    LoaderOptions loader_options;
    loader_options.worker_threads = 2;
    loader_options.hooks = std::make_shared<const LoadHooks>(std::move(hooks));
    Loader loader(loader_options);
    LoadHandle cached = loader.Load(hub, *plan, options);
    // Started once the cached load's reads are done: it needs the loop from its first step.
    while (cached.progress().tensors_done < hub.tensors().size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    LoadHandle second = loader.Load(local, *local_plan);
    other_done.set_value(second.Done().get());
    CHECK(other.get().ok());
    REQUIRE(cached.Done().get().ok());
    CHECK(other_ended_first);
    CHECK(cached.read_stats().cache.starts_with("cached 4 file(s)"));
  }

  SECTION("a cancel while the cache is completed: the load is whole, nothing half-cached") {
    LoadHooks hooks;
    hooks.cancel_at = [](LoadStage stage) { return stage == LoadStage::kCompletingCache; };
    LoaderOptions loader_options;
    loader_options.hooks = std::make_shared<const LoadHooks>(std::move(hooks));
    Loader loader(loader_options);
    LoadHandle load = loader.Load(hub, *plan, options);
    // Every tensor was in place: the load succeeded; only its cache was stopped.
    REQUIRE(load.Done().get().ok());
    const std::string said = load.read_stats().cache;
    INFO(said);
    CHECK(said.starts_with("nothing cached"));
    CHECK(said.find("cancelled while its cache was completed") != std::string::npos);
    CHECK(BlobsUnder(repo) == 0);
    CHECK_FALSE(fs::exists(repo / "snapshots"));
    // The Loader goes on: the same load again caches it all.
    Loader again;
    LoadHandle second = again.Load(hub, *plan, options);
    REQUIRE(second.Done().get().ok());
    CHECK(second.read_stats().cache.starts_with("cached 4 file(s)"));
  }
}

TEST_CASE("remote: the next start reads the Hugging Face cache, offline too",
          "[pipeline][http]") {
  auto server = Serve(kFixtures.string());
  if (!server) return;
  const CachingHub hub_env(*server);
  const TempDir& cache = hub_env.cache;
  const std::string address = "hf://test/fixtures/safetensors/sharded";
  const Checkpoint local = OpenCase((kFixtures / "safetensors/sharded").string(), {});
  Loader loader;
  {  // Nothing cached yet: from the Hub, and cached as it streams.
    const Checkpoint hub = OpenCase(address, {});
    CHECK(hub.files()[0].path.starts_with("http://"));
    auto plan = Plan(hub, {});
    REQUIRE(plan.ok());
    LoadOptions options;
    options.hub_cache = "";  // HF_HUB_CACHE
    REQUIRE(loader.Load(hub, *plan, options).Done().get().ok());
  }
  const fs::path snapshot = fs::path(cache.path()) / "models--test--fixtures/snapshots" /
                            testing::kHubCommit / "safetensors/sharded";

  SECTION("online: the Hub names the commit, the bytes come from the cache") {
    const Checkpoint again = OpenCase(address, {});
    INFO(again.resolution());
    CHECK(again.resolution().starts_with("from the Hugging Face cache '" + cache.path() + "' at " +
                                         std::string(testing::kHubCommit).substr(0, 12)));
    for (const CheckpointFile& f : again.files()) CHECK(f.path.starts_with(snapshot.string()));
    CHECK(again.source() == address);
    CheckSame(loader, local, again);
    // Caching it again writes nothing, and says so.
    auto plan = Plan(again, {});
    REQUIRE(plan.ok());
    LoadOptions options;
    options.hub_cache = "";
    LoadHandle load = loader.Load(again, *plan, options);
    REQUIRE(load.Done().get().ok());
    CHECK(load.read_stats().cache == "nothing to write: read from the Hugging Face cache");
    // Not to be read: from the Hub.
    OpenOptions no_cache;
    no_cache.read_hub_cache = false;
    auto hub = Checkpoint::Open(address, no_cache);
    REQUIRE(hub.ok());
    CHECK(hub->files()[0].path.starts_with("http://"));
  }
  SECTION("a shard missing from the snapshot: the Hub serves them all, and that is said") {
    fs::remove(snapshot / "model-00002-of-00003.safetensors");
    const Checkpoint again = OpenCase(address, {});
    INFO(again.resolution());
    for (const CheckpointFile& f : again.files()) CHECK(f.path.starts_with("http://"));
    CHECK(again.resolution().find("the Hugging Face cache's copy was not used") !=
          std::string::npos);
    CheckSame(loader, local, again);
  }
  SECTION("HF_HUB_OFFLINE: the Hub is not asked, the revision is found through refs/") {
    ScopedEnv offline("HF_HUB_OFFLINE", "yes");
    ScopedEnv nowhere("HF_ENDPOINT", "http://127.0.0.1:9");  // nothing listens: never asked
    const Checkpoint again = OpenCase(address, {});
    INFO(again.resolution());
    CHECK(again.resolution().find("(HF_HUB_OFFLINE)") != std::string::npos);
    CheckSame(loader, local, again);
    // A revision the cache has no ref for, or a repository it does not hold: NotFound, saying
    // what to do.
    for (const char* absent : {"hf://test/fixtures@v2/safetensors/sharded", "hf://test/other"}) {
      auto missing = Checkpoint::Open(absent);
      INFO(absent << ": " << missing.status().ToString());
      CHECK(missing.status().code() == StatusCode::kNotFound);
      CHECK(missing.status().message().find("unset HF_HUB_OFFLINE") != std::string::npos);
    }
    OpenOptions no_cache;
    no_cache.read_hub_cache = false;
    CHECK(Checkpoint::Open(address, no_cache).status().code() == StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace loadstone
