#include "io/location.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "io/http_reader.h"
#include "io/http_wire.h"

namespace loadstone::io {
namespace {

constexpr std::string_view kHubForm = "hf://ORG/REPO[@REVISION][/PATH]";

bool Unreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

// Percent-encoding as Python's urllib.parse.quote(s, safe=keep) does it.
std::string Quote(std::string_view s, bool keep_slash) {
  std::string out;
  for (char c : s) {
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out += c;
    } else {
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    }
  }
  return out;
}

// A repository or organisation name: letters, digits, '-', '_', '.'.
bool RepoPart(std::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    if (!Unreserved(c) || c == '~') return false;
  }
  return true;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::string();
  return line;
}

// `s` without the spaces, tabs and line ends around it.
std::string_view Trimmed(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// An endpoint as given, without the '/' it may end with.
std::string Endpoint(std::string endpoint) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

// The keys of [profile] in an ini file (the shared credentials file's form).
std::map<std::string, std::string> IniSection(const std::string& path, const std::string& profile) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  for (int lines = 0; lines < 100000 && std::getline(in, line); ++lines) {
    const std::string_view l = Trimmed(line);
    if (l.empty() || l.front() == '#' || l.front() == ';') continue;
    if (l.front() == '[') {
      inside = l == fmt::format("[{}]", profile);
      continue;
    }
    const size_t eq = l.find('=');
    if (inside && eq != std::string_view::npos) {
      out[std::string(Trimmed(l.substr(0, eq)))] = std::string(Trimmed(l.substr(eq + 1)));
    }
  }
  return out;
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> Unquoted(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    const int hi = Hex(s[i + 1]);
    const int lo = Hex(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

}  // namespace

bool IsS3Address(std::string_view path) { return StartsWithNoCase(path, "s3://"); }

Result<S3Address> ParseS3Address(std::string_view s3) {
  if (!IsS3Address(s3)) {
    return Status::InvalidArgument(fmt::format("'{}' is not an s3:// address", s3));
  }
  std::string_view rest = s3.substr(5);
  const size_t slash = rest.find('/');
  S3Address out;
  out.bucket = std::string(rest.substr(0, slash));
  const bool valid = !out.bucket.empty() && std::all_of(out.bucket.begin(), out.bucket.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  });
  if (!valid) {
    return Status::InvalidArgument(fmt::format(
        "'{}' names no bucket (lowercase letters, digits, '-', '.'); the form is s3://BUCKET/KEY",
        s3));
  }
  out.key = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash + 1));
  out.region = Env("AWS_REGION");
  if (out.region.empty()) out.region = Env("AWS_DEFAULT_REGION");
  if (out.region.empty()) out.region = "us-east-1";
  std::string endpoint = Endpoint(Env("AWS_ENDPOINT_URL_S3"));
  if (endpoint.empty()) endpoint = Endpoint(Env("AWS_ENDPOINT_URL"));
  // A bucket with dots does not match AWS's wildcard certificate as a host name: path style,
  // as botocore does.
  if (endpoint.empty() && out.bucket.find('.') != std::string::npos) {
    endpoint = fmt::format("https://s3.{}.amazonaws.com", out.region);
  }
  out.address = endpoint.empty()
                    ? fmt::format("https://{}.s3.{}.amazonaws.com", out.bucket, out.region)
                    : fmt::format("{}/{}", endpoint, out.bucket);
  // The key is an address's path already (JoinLocation encoded the names joined to it).
  if (!out.key.empty()) out.address += "/" + out.key;
  return out;
}

Result<S3Credentials> FindS3Credentials() {
  S3Credentials c{Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"), Env("AWS_SESSION_TOKEN")};
  if (!c.access_key.empty() && !c.secret_key.empty()) return c;
  if (!c.access_key.empty() || !c.secret_key.empty()) {  // botocore: PartialCredentialsError
    return Status::InvalidArgument(fmt::format(
        "{} is set but {} is not: set both (or neither, to use the shared credentials file)",
        c.access_key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
        c.access_key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY"));
  }
  std::string file = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty() && !Env("HOME").empty()) file = fmt::format("{}/.aws/credentials", Env("HOME"));
  const std::string profile = Env("AWS_PROFILE").empty() ? "default" : Env("AWS_PROFILE");
  if (!file.empty()) {
    auto keys = IniSection(file, profile);
    c = {keys["aws_access_key_id"], keys["aws_secret_access_key"], keys["aws_session_token"]};
    if (!c.access_key.empty() && !c.secret_key.empty()) return c;
  }
  return Status::InvalidArgument(fmt::format(
      "no AWS credentials to sign S3 requests with: set AWS_ACCESS_KEY_ID and "
      "AWS_SECRET_ACCESS_KEY, or give profile [{}] in '{}' (AWS_PROFILE, "
      "AWS_SHARED_CREDENTIALS_FILE)",
      profile, file.empty() ? std::string("~/.aws/credentials") : file));
}

bool IsHubAddress(std::string_view path) { return StartsWithNoCase(path, "hf://"); }

Result<HubAddress> ParseHubAddress(std::string_view hf) {
  const std::string given(hf);
  auto refuse = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("'{}' is not a Hub address: {}; the form is {}", given, why, kHubForm));
  };
  if (!IsHubAddress(hf)) return refuse("it does not start with hf://");
  std::string_view rest = hf.substr(5);
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return refuse("it names no ORG/REPO");
  const std::string_view org = rest.substr(0, slash);
  if (org == "datasets" || org == "spaces") {
    return Status::Unsupported(fmt::format(
        "'{}' is a Hub {} address: loadstone reads model repositories (hf://ORG/REPO/...)", given,
        org.substr(0, org.size() - 1)));
  }
  rest.remove_prefix(slash + 1);
  size_t end = rest.find_first_of("@/");
  const std::string_view name = rest.substr(0, end);
  if (!RepoPart(org) || !RepoPart(name)) {
    return refuse("ORG and REPO are letters, digits, '-', '_' and '.'");
  }
  HubAddress out;
  out.repo = fmt::format("{}/{}", org, name);
  out.revision = "main";
  rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  if (!rest.empty() && rest.front() == '@') {
    rest.remove_prefix(1);
    // refs/pr/N is one revision, slashes and all (as huggingface_hub's HfFileSystem reads it).
    size_t rev_end = rest.find('/');
    if (rest.starts_with("refs/pr/")) rev_end = rest.find('/', 8);
    out.revision = std::string(rest.substr(0, rev_end));
    if (out.revision.empty()) return refuse("the revision after '@' is empty");
    rest = rev_end == std::string_view::npos ? std::string_view() : rest.substr(rev_end);
  }
  while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  out.path = std::string(rest);
  // libcurl would resolve "." and ".." segments, leaving the revision or the repository.
  for (const std::string& part : {out.revision, out.path}) {
    for (size_t start = 0; start <= part.size();) {
      size_t stop = part.find('/', start);
      if (stop == std::string::npos) stop = part.size();
      const std::string_view segment = std::string_view(part).substr(start, stop - start);
      if (segment == "." || segment == "..") return refuse("'.' and '..' are not path segments here");
      start = stop + 1;
    }
  }
  out.address = fmt::format("{}/{}/resolve/{}", HubEndpoint(), out.repo, Quote(out.revision, false));
  if (!out.path.empty()) out.address = JoinLocation(out.address, out.path);
  return out;
}

std::string HubCacheRoot() {
  for (const char* name : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"}) {
    if (std::string v = Env(name); !v.empty()) return v;
  }
  if (std::string home = Env("HF_HOME"); !home.empty()) return home + "/hub";
  std::string xdg = Env("XDG_CACHE_HOME");
  if (xdg.empty()) xdg = Env("HOME") + "/.cache";
  return xdg + "/huggingface/hub";
}

bool HubOffline() {
  std::string v = Env("HF_HUB_OFFLINE");
  if (v.empty()) v = Env("TRANSFORMERS_OFFLINE");
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

std::string HubRepoFolder(const std::string& root, const std::string& repo) {
  std::string out = root + "/models--" + repo;
  for (size_t at = out.find('/', root.size() + 1); at != std::string::npos; at = out.find('/', at)) {
    out.replace(at, 1, "--");
  }
  return out;
}

std::string HubSnapshotFolder(const std::string& root, const std::string& repo,
                              const std::string& commit) {
  return HubRepoFolder(root, repo) + "/snapshots/" + commit;
}

std::optional<std::string> CachedCommit(const std::string& root, const std::string& repo,
                                        const std::string& revision) {
  if (IsCommitHash(revision)) return revision;
  // A revision is a ref's name (refs/pr/1 too), never a way out of refs/.
  if (!IsRepositoryPath(revision)) return std::nullopt;
  std::string commit(Trimmed(FirstLine(HubRepoFolder(root, repo) + "/refs/" + revision)));
  if (!IsCommitHash(commit)) return std::nullopt;
  return commit;
}

namespace {

// A resolve/ address on the Hub's endpoint ({HF_ENDPOINT}/ORG/REPO/resolve/REVISION[/PATH])
// cut into its parts as written (percent-encoded): views into the address.
struct ResolveParts {
  std::string_view repo, revision, path;  // path: empty for the revision's root
};
std::optional<ResolveParts> SplitResolve(std::string_view url) {
  const std::string endpoint = HubEndpoint() + "/";
  if (!url.starts_with(endpoint)) return std::nullopt;
  url.remove_prefix(endpoint.size());
  const size_t resolve = url.find("/resolve/");
  if (resolve == std::string_view::npos) return std::nullopt;
  const std::string_view rest = url.substr(resolve + 9);
  const size_t slash = std::min(rest.find('/'), rest.size());
  if (slash == 0) return std::nullopt;
  return ResolveParts{url.substr(0, resolve), rest.substr(0, slash),
                      rest.substr(std::min(slash + 1, rest.size()))};
}

}  // namespace

bool IsRepositoryPath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  for (size_t start = 0; start <= path.size();) {
    const size_t slash = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = slash + 1;
  }
  return true;
}

bool IsCommitHash(std::string_view s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::optional<HubFile> HubFileOf(std::string_view url) {
  const std::optional<ResolveParts> parts = SplitResolve(url);
  if (!parts || parts->path.empty()) return std::nullopt;
  auto repo = Unquoted(parts->repo);
  auto revision = Unquoted(parts->revision);
  auto path = Unquoted(parts->path);
  if (!repo || !revision || !path || std::count(repo->begin(), repo->end(), '/') != 1) {
    return std::nullopt;
  }
  return HubFile{std::move(*repo), std::move(*revision), std::move(*path)};
}

std::string WithHubRevision(const std::string& url, std::string_view revision) {
  const std::optional<ResolveParts> parts = SplitResolve(url);
  if (!parts) return url;
  const size_t start = static_cast<size_t>(parts->revision.data() - url.data());
  return url.substr(0, start) + std::string(revision) + url.substr(start + parts->revision.size());
}

std::string HubEndpoint() {
  const std::string endpoint = Endpoint(Env("HF_ENDPOINT"));
  return endpoint.empty() ? std::string("https://huggingface.co") : endpoint;
}

std::string HubToken() {
  // Trimmed as huggingface_hub trims it: a secret mounted from a file often ends in a newline,
  // which must not reach a header.
  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    if (std::string token(Trimmed(Env(name))); !token.empty()) return token;
  }
  std::string path = Env("HF_TOKEN_PATH");
  if (path.empty() && !Env("HF_HOME").empty()) path = fmt::format("{}/token", Env("HF_HOME"));
  if (path.empty() && !Env("XDG_CACHE_HOME").empty()) {
    path = fmt::format("{}/huggingface/token", Env("XDG_CACHE_HOME"));
  }
  if (path.empty() && !Env("HOME").empty()) {
    path = fmt::format("{}/.cache/huggingface/token", Env("HOME"));
  }
  return path.empty() ? std::string() : std::string(Trimmed(FirstLine(path)));
}

bool SendsHubToken(std::string_view url) {
  const std::string endpoint = HubEndpoint() + "/";
  return url.size() > endpoint.size() && url.substr(0, endpoint.size()) == endpoint;
}

std::string CaBundle(bool s3) {
  if (s3 && !Env("AWS_CA_BUNDLE").empty()) return Env("AWS_CA_BUNDLE");
  for (const char* name : {"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    if (std::string path = Env(name); !path.empty()) return path;
  }
  return std::string();
}

bool MayBeThere(const std::string& path) {
  std::error_code ec;
  return IsRemoteAddress(path) || std::filesystem::is_regular_file(path, ec);
}

std::string JoinLocation(std::string_view dir, std::string_view name) {
  if (!IsRemoteAddress(dir)) return (std::filesystem::path(dir) / name).string();
  while (!dir.empty() && dir.back() == '/') dir.remove_suffix(1);
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  return fmt::format("{}/{}", dir, Quote(name, true));
}

std::string ParentLocation(std::string_view path) {
  if (!IsRemoteAddress(path)) return std::filesystem::path(path).parent_path().string();
  const size_t slash = path.rfind('/');
  return std::string(path.substr(0, slash == std::string_view::npos ? 0 : slash));
}

}  // namespace loadstone::io
