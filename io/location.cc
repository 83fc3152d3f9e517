#include "io/location.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "io/http_reader.h"

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
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

bool IsHubAddress(std::string_view path) {
  if (path.size() < 5) return false;
  const std::string_view scheme = path.substr(0, 5);
  return (scheme[0] == 'h' || scheme[0] == 'H') && (scheme[1] == 'f' || scheme[1] == 'F') &&
         scheme.substr(2) == "://";
}

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
  out.address = fmt::format("{}/{}/resolve/{}", HubEndpoint(), out.repo, Quote(out.revision, false));
  if (!out.path.empty()) out.address = JoinLocation(out.address, out.path);
  return out;
}

std::string HubEndpoint() {
  std::string endpoint = Env("HF_ENDPOINT");
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint.empty() ? std::string("https://huggingface.co") : endpoint;
}

std::string HubToken() {
  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    if (std::string token = Env(name); !token.empty()) return token;
  }
  std::string path = Env("HF_TOKEN_PATH");
  if (path.empty() && !Env("HF_HOME").empty()) path = fmt::format("{}/token", Env("HF_HOME"));
  if (path.empty() && !Env("HOME").empty()) {
    path = fmt::format("{}/.cache/huggingface/token", Env("HOME"));
  }
  return path.empty() ? std::string() : FirstLine(path);
}

bool SendsHubToken(std::string_view url) {
  const std::string endpoint = HubEndpoint() + "/";
  return url.size() > endpoint.size() && url.substr(0, endpoint.size()) == endpoint;
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
