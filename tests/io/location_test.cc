// io/location.h: hf:// addresses taken apart as huggingface_hub builds its resolve/ URLs (the
// endpoint from HF_ENDPOINT, the revision percent-encoded whole, the path but for its slashes),
// malformed ones refused with the form; the token's sources in huggingface_hub's order; s3://
// addresses at their endpoint (path style) or AWS's virtual-hosted address, the credentials from
// the environment or the shared file's profile; names joined inside local folders and
// addresses alike.
#include "io/location.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "io/http_reader.h"
#include "io/http_wire.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace loadstone::io {
namespace {

// Every variable the Hub's and S3's settings are read from, unset for the scope, put back after.
class HubEnv {
 public:
  HubEnv() {
    for (const char* name : {"HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
                             "HF_HOME", "HOME", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
                             "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                             "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                             "AWS_SHARED_CREDENTIALS_FILE", "XDG_CACHE_HOME"}) {
      unset_.push_back(std::make_unique<testing::ScopedEnv>(name, std::nullopt));
    }
  }

 private:
  std::vector<std::unique_ptr<testing::ScopedEnv>> unset_;
};

TEST_CASE("location: hf:// addresses become the Hub's resolve/ addresses", "[io][location]") {
  HubEnv env;
  auto a = ParseHubAddress("hf://org/repo");
  REQUIRE(a.ok());
  CHECK(a->repo == "org/repo");
  CHECK(a->revision == "main");
  CHECK(a->path.empty());
  CHECK(a->address == "https://huggingface.co/org/repo/resolve/main");

  ::setenv("HF_ENDPOINT", "http://127.0.0.1:8080/mirror/", 1);
  auto b = ParseHubAddress("HF://org/re.po_1@refs/pr/7/text encoder/");
  REQUIRE(b.ok());
  CHECK(b->revision == "refs/pr/7");
  CHECK(b->path == "text encoder");
  CHECK(b->address == "http://127.0.0.1:8080/mirror/org/re.po_1/resolve/refs%2Fpr%2F7/text%20encoder");
  auto c = ParseHubAddress("hf://org/repo@v1.0/unet/diffusion_pytorch_model.safetensors");
  REQUIRE(c.ok());
  CHECK(c->revision == "v1.0");
  CHECK(c->address ==
        "http://127.0.0.1:8080/mirror/org/repo/resolve/v1.0/unet/diffusion_pytorch_model.safetensors");

  CHECK(ParseHubAddress("hf://datasets/org/x").status().code() == StatusCode::kUnsupported);
  for (const char* bad : {"hf://", "hf://repo", "hf://org/", "hf://org/re po", "hf://../repo",
                          "hf://org/repo@", "hf://org/repo@/x", "hf://org/repo/../other",
                          "hf://org/repo@../main/x", "hf://org/repo/a/./b"}) {
    INFO(bad);
    auto refused = ParseHubAddress(bad);
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("hf://ORG/REPO[@REVISION][/PATH]") != std::string::npos);
  }
}

TEST_CASE("location: the Hub's token, from where huggingface_hub looks, to its endpoint only",
          "[io][location]") {
  HubEnv env;
  testing::TempDir dir;
  ::setenv("HOME", dir.path().c_str(), 1);
  CHECK(HubToken().empty());
  dir.Write(".cache/huggingface/token", "hf_home_file\n");
  CHECK(HubToken() == "hf_home_file");
  dir.Write("hub-home/token", "hf_hf_home\r\n");
  ::setenv("HF_HOME", dir.Path("hub-home").c_str(), 1);
  CHECK(HubToken() == "hf_hf_home");
  dir.Write("elsewhere", "hf_path");
  ::setenv("HF_TOKEN_PATH", dir.Path("elsewhere").c_str(), 1);
  CHECK(HubToken() == "hf_path");
  ::setenv("HUGGING_FACE_HUB_TOKEN", "hf_old_name", 1);
  CHECK(HubToken() == "hf_old_name");
  ::setenv("HF_TOKEN", " hf_env\n", 1);  // a secret from a file: its newline goes
  CHECK(HubToken() == "hf_env");

  CHECK(SendsHubToken("https://huggingface.co/org/repo/resolve/main/model.safetensors"));
  CHECK_FALSE(SendsHubToken("https://huggingface.co.evil.example/org/repo"));
  CHECK_FALSE(SendsHubToken("https://cdn-lfs.hf.co/repos/ab/cd"));
  ::setenv("HF_ENDPOINT", "http://127.0.0.1:9/hub", 1);
  CHECK(SendsHubToken("http://127.0.0.1:9/hub/org/repo/resolve/main/x"));
  CHECK_FALSE(SendsHubToken("http://127.0.0.1:9/hubx/org/repo"));
  CHECK_FALSE(SendsHubToken("https://huggingface.co/org/repo/resolve/main/x"));
}

TEST_CASE("location: s3:// addresses, their endpoint, region and credentials", "[io][location]") {
  HubEnv env;
  testing::TempDir dir;
  ::setenv("HOME", dir.path().c_str(), 1);
  auto aws = ParseS3Address("s3://my-models/llama/7b");
  REQUIRE(aws.ok());
  CHECK(aws->bucket == "my-models");
  CHECK(aws->key == "llama/7b");
  CHECK(aws->region == "us-east-1");
  CHECK(aws->address == "https://my-models.s3.us-east-1.amazonaws.com/llama/7b");
  ::setenv("AWS_DEFAULT_REGION", "eu-west-1", 1);
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  auto local = ParseS3Address("S3://b/k.safetensors");
  REQUIRE(local.ok());
  CHECK(local->region == "eu-west-1");
  CHECK(local->address == "http://127.0.0.1:9000/b/k.safetensors");
  ::setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001", 1);
  ::setenv("AWS_REGION", "ap-south-1", 1);
  CHECK(ParseS3Address("s3://b")->address == "http://127.0.0.1:9001/b");
  CHECK(ParseS3Address("s3://b")->region == "ap-south-1");
  CHECK(ParseS3Address("s3:///k").status().code() == StatusCode::kInvalidArgument);
  CHECK(ParseS3Address("s3://Upper_case/k").status().code() == StatusCode::kInvalidArgument);
  // The key is already an address's path: not encoded again.
  CHECK(ParseS3Address("s3://b/a%20b/k")->address == "http://127.0.0.1:9001/b/a%20b/k");
  ::unsetenv("AWS_ENDPOINT_URL_S3");
  ::unsetenv("AWS_ENDPOINT_URL");
  CHECK(ParseS3Address("s3://my.models/k")->address ==
        "https://s3.ap-south-1.amazonaws.com/my.models/k");  // dots: path style

  auto none = FindS3Credentials();
  CHECK(none.status().code() == StatusCode::kInvalidArgument);
  CHECK(none.status().message().find(dir.Path(".aws/credentials")) != std::string::npos);
  dir.Write(".aws/credentials",
            "# comment\n[default]\naws_access_key_id = AK\naws_secret_access_key=SK \n"
            "[work]\naws_access_key_id = WK\naws_secret_access_key = WS\naws_session_token = T\n");
  CHECK(FindS3Credentials()->access_key == "AK");
  CHECK(FindS3Credentials()->secret_key == "SK");
  ::setenv("AWS_PROFILE", "work", 1);
  CHECK(FindS3Credentials()->session_token == "T");
  ::setenv("AWS_ACCESS_KEY_ID", "EK", 1);
  CHECK(FindS3Credentials().status().message().find("AWS_SECRET_ACCESS_KEY is not") !=
        std::string::npos);  // half a pair is an error, not the file
  ::setenv("AWS_SECRET_ACCESS_KEY", "ES", 1);
  CHECK(FindS3Credentials()->access_key == "EK");
  CHECK(FindS3Credentials()->session_token.empty());
}

TEST_CASE("location: an s3 403 may be a key that is not there, an http 403 is a refusal",
          "[io][location]") {
  const Status s3 = HttpError(403, "s3://b/config.json", "a request for byte 0");
  const Status http = HttpError(403, "https://h/config.json", "a request for byte 0");
  CHECK(AccessRefused(s3));
  CHECK(AbsentObject("s3://b/config.json", s3));
  CHECK_FALSE(AbsentObject("https://h/config.json", http));
  CHECK(AbsentObject("https://h/x", HttpError(404, "https://h/x", "a request for byte 0")));
  CHECK_FALSE(AbsentObject("s3://b/x", HttpError(401, "s3://b/x", "a request for byte 0")));
}

TEST_CASE("location: names join and folders split alike for paths and addresses",
          "[io][location]") {
  CHECK(JoinLocation("/models/llama", "model.safetensors") == "/models/llama/model.safetensors");
  CHECK(JoinLocation("http://h/models/", "/unet") == "http://h/models/unet");
  CHECK(JoinLocation("https://h/m", "sub/a b#1?.safetensors") == "https://h/m/sub/a%20b%231%3F.safetensors");
  CHECK(ParentLocation("/models/llama/model.safetensors.index.json") == "/models/llama");
  CHECK(ParentLocation("https://h/r/resolve/main/model.safetensors.index.json") ==
        "https://h/r/resolve/main");
}

}  // namespace
}  // namespace loadstone::io
