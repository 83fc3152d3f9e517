// HubCache's rules that need no server: where the cache is, which addresses are the Hub's
// files, what a cache that is not finished leaves behind (nothing but folders), and what it
// refuses. The streaming itself, against nginx: remote_load_test's "--cache" case.
#include "io/hub_cache.h"

#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "io/location.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace loadstone::io {
namespace {

namespace fs = std::filesystem;
using testing::ScopedEnv;
using testing::TempDir;

constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";

HttpObject HubObject(const std::string& path, uint64_t size) {
  HttpObject o;
  o.url = HubEndpoint() + "/org/repo/resolve/" + kCommit + "/" + path;
  o.effective_url = o.url;
  o.size = size;
  o.linked_etag = "\"abc123\"";
  o.repo_commit = kCommit;
  return o;
}

// The files under `dir`, folders left out.
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_directory()) out.push_back(e.path().string());
  }
  return out;
}

TEST_CASE("hub cache: its folder is huggingface_hub's", "[io][hub_cache]") {
  ScopedEnv hub_cache("HF_HUB_CACHE", std::nullopt);
  ScopedEnv legacy("HUGGINGFACE_HUB_CACHE", std::nullopt);
  ScopedEnv hf_home("HF_HOME", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", "/x");
  CHECK(HubCacheRoot() == "/x/huggingface/hub");
  hf_home.Set("/h");
  CHECK(HubCacheRoot() == "/h/hub");
  legacy.Set("/legacy");
  CHECK(HubCacheRoot() == "/legacy");
  hub_cache.Set("/c");
  CHECK(HubCacheRoot() == "/c");
}

TEST_CASE("hub cache: the Hub's files are told from their resolve/ addresses", "[io][hub_cache]") {
  ScopedEnv endpoint("HF_ENDPOINT", "http://127.0.0.1:9");
  auto file = HubFileOf("http://127.0.0.1:9/org/repo/resolve/refs%2Fpr%2F1/unet/a%20b.bin");
  REQUIRE(file);
  CHECK(file->repo == "org/repo");
  CHECK(file->revision == "refs/pr/1");
  CHECK(file->path == "unet/a b.bin");
  CHECK_FALSE(HubFileOf("http://127.0.0.1:10/org/repo/resolve/main/a.bin"));
  CHECK_FALSE(HubFileOf("http://127.0.0.1:9/org/repo/blob/main/a.bin"));
  CHECK_FALSE(HubFileOf("http://127.0.0.1:9/org/repo/resolve/main/bad%zz"));
  CHECK_FALSE(HubFileOf("http://127.0.0.1:9/org/repo/resolve/main"));  // a folder, not a file

  // A folder's address pinned to a commit: the revision alone is replaced, wherever the path.
  const std::string commit(40, 'a');
  CHECK(IsCommitHash(commit));
  CHECK_FALSE(IsCommitHash(std::string(40, 'A')));
  CHECK_FALSE(IsCommitHash("main"));
  CHECK(WithHubRevision("http://127.0.0.1:9/org/repo/resolve/refs%2Fpr%2F1/unet", commit) ==
        "http://127.0.0.1:9/org/repo/resolve/" + commit + "/unet");
  CHECK(WithHubRevision("http://127.0.0.1:9/org/repo/resolve/main", commit) ==
        "http://127.0.0.1:9/org/repo/resolve/" + commit);
  CHECK(WithHubRevision("http://127.0.0.1:10/org/repo/resolve/main", commit) ==
        "http://127.0.0.1:10/org/repo/resolve/main");
}

TEST_CASE("hub cache: a cache not finished leaves no file, and what it cannot take is said",
          "[io][hub_cache]") {
  ScopedEnv endpoint("HF_ENDPOINT", "http://127.0.0.1:9");
  TempDir root;
  HubCacheTarget target{root.path(), "main", {}};
  {
    auto cache = HubCache::Create(target, {HubObject("model.safetensors", 1000)});
    REQUIRE(cache.ok());
    const std::vector<std::byte> bytes(100, std::byte{7});
    (*cache)->Wrote(0, 0, bytes);
    CHECK(FilesUnder(root.path()).size() == 1);  // the part file
  }
  CHECK(FilesUnder(root.path()).empty());  // a load failed or cancelled: no blob, no part

  HttpObject other = HubObject("x.bin", 10);
  other.url = "http://127.0.0.1:9/elsewhere/x.bin";
  auto refused = HubCache::Create(target, {other});
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("hf://") != std::string::npos);

  // A shard named out of the repository, or a version unfit for a blob's name: left out.
  HttpObject escape = HubObject("a/../../x.bin", 10);
  HttpObject unnamed = HubObject("y.bin", 10);
  unnamed.linked_etag = "\"a/b\"";
  auto cache = HubCache::Create(target, {escape, unnamed});
  REQUIRE(cache.ok());
  const std::string said = (*cache)->Finish();
  CHECK(said.find("nothing cached") != std::string::npos);
  CHECK(said.find("no path inside a repository") != std::string::npos);
  CHECK(said.find("fit for a blob's name") != std::string::npos);
  CHECK(FilesUnder(root.path()).empty());
}

}  // namespace
}  // namespace loadstone::io
