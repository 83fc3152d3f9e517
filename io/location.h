// Where a checkpoint's files are: a local path, an http(s) address, an S3 object
// (s3://BUCKET/KEY, asked for at its http(s) address with a SigV4 signature), or a Hugging Face
// Hub address (hf://ORG/REPO[@REVISION][/PATH]) turned into the http(s) address huggingface_hub
// asks: {HF_ENDPOINT}/ORG/REPO/resolve/{REVISION}/PATH. Names inside a folder join the same
// way for all of them.
#ifndef LOADSTONE_IO_LOCATION_H_
#define LOADSTONE_IO_LOCATION_H_

#include <optional>
#include <string>
#include <string_view>

#include "loadstone/status.h"

namespace loadstone::io {

// True for hf:// addresses (any case of the scheme).
bool IsHubAddress(std::string_view path);
// True for s3:// addresses (any case of the scheme).
bool IsS3Address(std::string_view path);

// An s3:// address taken apart, as the AWS SDKs read the environment: the endpoint
// AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (path style: ENDPOINT/BUCKET/KEY), else
// https://BUCKET.s3.REGION.amazonaws.com/KEY; the region AWS_REGION, else AWS_DEFAULT_REGION,
// else us-east-1.
struct S3Address {
  std::string bucket, key, region;
  std::string address;  // the http(s) address asked
};
// Errors: InvalidArgument for an address without a bucket, saying what the form is.
Result<S3Address> ParseS3Address(std::string_view s3);

// The credentials a request to S3 is signed with: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY
// (+ AWS_SESSION_TOKEN), else the profile AWS_PROFILE (else "default") of the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials).
struct S3Credentials {
  std::string access_key, secret_key, session_token;
};
// Errors: InvalidArgument when there are none, naming where they were looked for.
Result<S3Credentials> FindS3Credentials();

// An hf:// address taken apart. `address` is the http(s) address it names: the repository's
// resolve/ root at the revision, then the path (a subfolder or a file; none for the root).
struct HubAddress {
  std::string repo;      // "ORG/REPO"
  std::string revision;  // "main" when none is given
  std::string path;      // within the repository, no leading '/'
  std::string address;   // {endpoint}/ORG/REPO/resolve/{revision, percent-encoded}[/path]
};

// hf://ORG/REPO[@REVISION][/PATH]; a revision may be refs/pr/N (its slashes belong to it).
// Errors: InvalidArgument for an address without ORG/REPO, with an empty revision, or with
// characters a repository name cannot hold, saying what the form is.
Result<HubAddress> ParseHubAddress(std::string_view hf);

// The cache huggingface_hub uses: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub,
// else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
std::string HubCacheRoot();
// HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) is 1, ON, YES or TRUE, any case, as huggingface_hub
// reads it: the Hub is not asked; files come from the cache only.
bool HubOffline();
// ROOT/models--ORG--REPO: a repository's folder in the cache at `root`.
std::string HubRepoFolder(const std::string& root, const std::string& repo);
// ROOT/models--ORG--REPO/snapshots/COMMIT: where a commit's files are linked in the cache.
std::string HubSnapshotFolder(const std::string& root, const std::string& repo,
                              const std::string& commit);
// The commit `revision` of `repo` is in the cache at `root`: the revision itself when it is a
// commit id, else what its refs/REVISION file names; nullopt when there is none.
std::optional<std::string> CachedCommit(const std::string& root, const std::string& repo,
                                        const std::string& revision);

// A file of a Hub repository, read off its resolve/ address
// ({HF_ENDPOINT}/ORG/REPO/resolve/REVISION/PATH, io/location.h), percent-decoded.
struct HubFile {
  std::string repo;      // ORG/REPO
  std::string revision;  // as in the address: a commit once a folder was pinned to it
  std::string path;      // within the repository
};
std::optional<HubFile> HubFileOf(std::string_view url);
// `url`, a resolve/ address, with its revision replaced by `revision` (written as it goes in
// the address); any other address unchanged.
std::string WithHubRevision(const std::string& url, std::string_view revision);
// A path inside a repository (a file's, or a ref's name such as refs/pr/1): relative, its
// components neither empty nor "." nor "..".
bool IsRepositoryPath(std::string_view path);
// A full commit id as the Hub writes it: 40 lowercase hex digits.
bool IsCommitHash(std::string_view s);

// The Hub's address: HF_ENDPOINT without a trailing '/', else https://huggingface.co.
std::string HubEndpoint();
// The token huggingface_hub would send: HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else the first
// line of the token file (HF_TOKEN_PATH, else $HF_HOME/token, else ~/.cache/huggingface/token);
// empty when there is none.
std::string HubToken();
// True when requests to `url` carry the Hub's token: it is on the Hub's endpoint. A redirect to
// another host (the Hub's CDN) is not given it (libcurl drops Authorization on such a redirect).
bool SendsHubToken(std::string_view url);

// The certificate authorities to trust for https instead of the system's: CURL_CA_BUNDLE, else
// REQUESTS_CA_BUNDLE (what huggingface_hub's requests reads), else SSL_CERT_FILE; for an s3://
// object AWS_CA_BUNDLE first. Empty: the system's.
std::string CaBundle(bool s3);

// False only for a local path that is no regular file: an address may hold a file (its absence
// is the NotFound its first request gets, one request rather than two).
bool MayBeThere(const std::string& path);

// `name` inside the folder `dir`: "dir/name" for an address (a '/' between, one only; the name
// percent-encoded but for its slashes), the std::filesystem join for a local path.
std::string JoinLocation(std::string_view dir, std::string_view name);
// The folder `path` is in: an address up to its last '/', a local path's parent_path().
std::string ParentLocation(std::string_view path);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_LOCATION_H_
