// HubCache (hub_cache.h): the part files as a load streams, then the blobs, snapshot links and
// refs of huggingface_hub's layout once it succeeded.
#include "io/hub_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "io/location.h"
#include "io/out_file.h"
#include "io/posix_error.h"

namespace loadstone::io {

namespace fs = std::filesystem;

struct HubCache::Entry {
  HttpObject object;
  HubFile file;
  std::string repo_dir;  // ROOT/models--ORG--REPO
  std::string blob;      // its name in blobs/
  std::string commit;
  std::string part;      // the part file; empty when the blob was there already
  int fd = -1;
  std::mutex mu;
  std::map<uint64_t, uint64_t> have;  // written: start -> end, disjoint; guarded by mu
  std::string broken;                 // why it is not cached; guarded by mu

  ~Entry() {
    if (fd >= 0) ::close(fd);
    if (!part.empty()) ::unlink(part.c_str());
  }
  void Break(std::string why) {
    if (broken.empty()) broken = std::move(why);
  }
  // [start, end) ranges not written yet.
  std::vector<std::pair<uint64_t, uint64_t>> Gaps() const {
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t at = 0;
    for (const auto& [start, end] : have) {
      if (start > at) gaps.emplace_back(at, start);
      at = std::max(at, end);
    }
    if (at < object.size) gaps.emplace_back(at, object.size);
    return gaps;
  }
};

namespace {

// A name that is one file in a folder: letters, digits, '.', '_', '-', and not "." or "..".
bool PlainName(std::string_view s) {
  return !s.empty() && s.size() <= 255 && s != "." && s != ".." &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '.' || c == '_' || c == '-';
         });
}

// huggingface_hub's _normalize_etag: no weak marker, no quotes.
std::string NormalizedEtag(std::string_view etag) {
  if (etag.starts_with("W/")) etag.remove_prefix(2);
  while (!etag.empty() && etag.front() == '"') etag.remove_prefix(1);
  while (!etag.empty() && etag.back() == '"') etag.remove_suffix(1);
  return std::string(etag);
}

Status MakeFolders(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return ec ? Status::IOError(fmt::format("cannot create the folder '{}': {}", dir, ec.message()))
            : Status::OK();
}

// The entry for `object`, or why the cache cannot take it.
Result<std::unique_ptr<HubCache::Entry>> EntryFor(const std::string& root, const HttpObject& object,
                                                  const HubFile& file) {
  auto e = std::make_unique<HubCache::Entry>();
  e->object = object;
  e->file = file;
  e->repo_dir = HubRepoFolder(root, file.repo);
  e->blob = NormalizedEtag(!object.linked_etag.empty() ? object.linked_etag : object.etag);
  e->commit = IsCommitHash(object.repo_commit) ? object.repo_commit : file.revision;
  if (!PlainName(e->blob)) {
    return Status::Unsupported(fmt::format("'{}': its server named no version (ETag, X-Linked-Etag) "
                                           "fit for a blob's name",
                                           file.path));
  }
  if (!IsCommitHash(e->commit)) {
    return Status::Unsupported(
        fmt::format("'{}': its server named no commit (X-Repo-Commit)", file.path));
  }
  if (!IsRepositoryPath(file.path)) {
    return Status::Unsupported(fmt::format("'{}' is no path inside a repository", file.path));
  }
  const std::string blobs = e->repo_dir + "/blobs";
  LOADSTONE_RETURN_IF_ERROR(MakeFolders(blobs));
  struct stat st;
  const std::string blob = blobs + "/" + e->blob;
  if (::stat(blob.c_str(), &st) == 0) return e;  // cached before: only its link is wanted
  const std::string part = fmt::format("{}.{}.loadstone-part", blob, ::getpid());
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", part);
  e->fd = fd;
  e->part = part;
  // The room, asked for now: a full disk leaves this file out before the load, not after it.
  const int err = object.size ? ::posix_fallocate(fd, 0, static_cast<off_t>(object.size)) : 0;
  if (err == ENOSPC) {
    return Status::IOError(fmt::format("no room for {} bytes in '{}'", object.size, blobs));
  }
  if (err != 0 && ::ftruncate(fd, static_cast<off_t>(object.size)) != 0) {
    return ErrnoStatus(errno, "cannot size", part);
  }
  return e;
}

// Takes huggingface_hub's lock of `blob` (.locks/REPO/BLOB.lock) for a few seconds at most:
// the descriptor holding it, or -1 (the error in *why).
int LockBlob(const std::string& root, const HubCache::Entry& e, std::string* why) {
  const std::string dir = HubRepoFolder(root + "/.locks", e.file.repo);
  if (Status made = MakeFolders(dir); !made.ok()) {
    *why = made.message();
    return -1;
  }
  const std::string path = fmt::format("{}/{}.lock", dir, e.blob);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = ErrnoStatus(errno, "cannot open", path).message();
    return -1;
  }
  for (int i = 0; i < 50; ++i) {  // 5 s
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::close(fd);
  *why = fmt::format("'{}' is held by another process (huggingface_hub downloading it?)", path);
  return -1;
}

// The snapshot's link to the blob, unless something is at its place already.
Status LinkSnapshot(const HubCache::Entry& e) {
  const std::string link = fmt::format("{}/snapshots/{}/{}", e.repo_dir, e.commit, e.file.path);
  LOADSTONE_RETURN_IF_ERROR(MakeFolders(fs::path(link).parent_path().string()));
  std::string target;
  for (size_t depth = std::count(e.file.path.begin(), e.file.path.end(), '/') + 2; depth > 0;
       --depth) {
    target += "../";
  }
  target += "blobs/" + e.blob;
  if (::symlink(target.c_str(), link.c_str()) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "cannot link", link);
  }
  return Status::OK();
}

// Puts a whole part file in place as its blob (unless another process made the blob since),
// then links the snapshot.
Status Commit(const std::string& root, HubCache::Entry& e) {
  if (!e.part.empty()) {
    std::string why;
    const int lock = LockBlob(root, e, &why);
    if (lock < 0) return Status::IOError(why);
    const std::string blob = fmt::format("{}/blobs/{}", e.repo_dir, e.blob);
    struct stat st;
    Status s = Status::OK();
    if (::stat(blob.c_str(), &st) != 0) {
      // On the disk before it has a name: a blob huggingface_hub trusts is never torn.
      if (::fdatasync(e.fd) != 0) {
        s = ErrnoStatus(errno, "cannot write out", e.part);
      } else if (::rename(e.part.c_str(), blob.c_str()) != 0) {
        s = ErrnoStatus(errno, "cannot rename", e.part);
      } else {
        e.part.clear();
      }
    }
    ::close(lock);  // releases the flock
    LOADSTONE_RETURN_IF_ERROR(s);
  }
  return LinkSnapshot(e);
}

// refs/REVISION := commit, unless it says so already.
Status WriteRef(const std::string& repo_dir, const std::string& revision,
                const std::string& commit) {
  if (revision.empty() || revision == commit || !IsRepositoryPath(revision)) return Status::OK();
  const std::string path = fmt::format("{}/refs/{}", repo_dir, revision);
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::string now(64, '\0');
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? ::read(fd, now.data(), now.size()) : -1;
    if (fd >= 0) ::close(fd);
    if (n >= 0 && std::string_view(now.data(), static_cast<size_t>(n)) == commit) return Status::OK();
  }
  LOADSTONE_RETURN_IF_ERROR(MakeFolders(fs::path(path).parent_path().string()));
  OutFile out;
  LOADSTONE_RETURN_IF_ERROR(out.OpenReplacing(path));
  LOADSTONE_RETURN_IF_ERROR(out.Write(std::string_view(commit)));
  return out.Commit();
}

// What Finish() says of each object left when Cancel() stopped it.
Status CompletionCancelled() {
  return Status::Cancelled("the load was cancelled while its cache was completed");
}

// Reads what `e` lacks from its server (the same version, else nothing), into its part file.
Status Complete(HubCache& cache, uint32_t file, HubCache::Entry& e, const std::atomic<bool>& cancelled,
                uint64_t* fetched) {
  const auto gaps = e.Gaps();
  if (gaps.empty()) return Status::OK();
  LOADSTONE_ASSIGN_OR_RETURN(std::shared_ptr<RemoteObject> remote, RemoteObject::Open(e.object.url));
  if (remote->object().size != e.object.size || remote->object().version() != e.object.version()) {
    return Status::Corruption(fmt::format("'{}' changed on its server during the load",
                                          e.object.url));
  }
  std::vector<std::byte> buffer(std::min<uint64_t>(8ULL << 20, e.object.size));
  for (const auto& [start, end] : gaps) {
    for (uint64_t at = start; at < end;) {
      if (cancelled) return CompletionCancelled();
      const uint64_t n = std::min<uint64_t>(buffer.size(), end - at);
      LOADSTONE_RETURN_IF_ERROR(remote->Read(at, std::span(buffer.data(), n)));
      cache.Wrote(file, at, std::span<const std::byte>(buffer.data(), n));
      *fetched += n;
      at += n;
    }
  }
  return Status::OK();
}

}  // namespace

Status NotAHubFile(const std::string& location, bool local) {
  return Status::InvalidArgument(fmt::format(
      "the Hugging Face cache is written for the Hub's files (hf:// addresses, HF_ENDPOINT {}); "
      "'{}' is {}: leave the cache out",
      HubEndpoint(), location, local ? "a local file, read where it is" : "not one"));
}

Result<std::shared_ptr<HubCache>> HubCache::Create(const HubCacheTarget& target,
                                                   const std::vector<HttpObject>& objects) {
  std::shared_ptr<HubCache> cache(new HubCache());
  cache->target_ = target;
  for (const HttpObject& object : objects) {
    const std::optional<HubFile> file = HubFileOf(object.url);
    if (!file) {
      return NotAHubFile(object.url, false);
    }
    Result<std::unique_ptr<Entry>> entry = EntryFor(target.root, object, *file);
    if (!entry.ok()) cache->left_out_.emplace_back(entry.status().message());
    cache->entries_.push_back(entry.ok() ? std::move(entry).value() : nullptr);
  }
  return cache;
}

HubCache::~HubCache() = default;

void HubCache::Wrote(uint32_t file, uint64_t offset, std::span<const std::byte> bytes) {
  if (file >= entries_.size() || !entries_[file] || entries_[file]->part.empty()) return;
  Entry& e = *entries_[file];
  {
    std::lock_guard lock(e.mu);
    if (!e.broken.empty()) return;
  }
  for (uint64_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pwrite(e.fd, bytes.data() + done, bytes.size() - done,
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::lock_guard lock(e.mu);
      e.Break(std::string(ErrnoStatus(n < 0 ? errno : ENOSPC, "cannot write", e.part).message()));
      return;
    }
    done += static_cast<uint64_t>(n);
  }
  std::lock_guard lock(e.mu);
  uint64_t start = offset, end = offset + bytes.size();
  // Merged with the ranges it touches.
  auto it = e.have.upper_bound(start);
  if (it != e.have.begin() && std::prev(it)->second >= start) --it;
  while (it != e.have.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = e.have.erase(it);
  }
  e.have.emplace(start, end);
}

Status HubCache::AddSideFile(const std::string& url) {
  LOADSTONE_ASSIGN_OR_RETURN(std::shared_ptr<RemoteObject> remote, RemoteObject::Open(url));
  const std::optional<HubFile> file = HubFileOf(url);
  if (!file) return Status::InvalidArgument(fmt::format("'{}' is not a Hub file", url));
  constexpr uint64_t kMost = 64ULL << 20;  // an index or a config, not weights
  if (remote->object().size > kMost) {
    return Status::Unsupported(fmt::format("'{}' is {} bytes: more than a side file should be",
                                           url, remote->object().size));
  }
  LOADSTONE_ASSIGN_OR_RETURN(std::unique_ptr<Entry> entry,
                             EntryFor(target_.root, remote->object(), *file));
  entries_.push_back(std::move(entry));
  Entry& e = *entries_.back();
  if (e.part.empty()) return Commit(target_.root, e);
  std::vector<std::byte> bytes(e.object.size);
  LOADSTONE_RETURN_IF_ERROR(remote->Read(0, bytes));
  Wrote(static_cast<uint32_t>(entries_.size() - 1), 0, bytes);
  if (!e.broken.empty()) return Status::IOError(e.broken);
  return Commit(target_.root, e);
}

std::string HubCache::Finish() {
  std::vector<std::string> problems = left_out_;
  uint64_t fetched = 0;
  size_t cached = 0;
  const size_t objects = entries_.size();
  const Entry* first = nullptr;
  for (size_t i = 0; i < objects; ++i) {
    if (!entries_[i]) continue;
    Entry& e = *entries_[i];
    Status s = e.part.empty() ? Status::OK()
                              : Complete(*this, static_cast<uint32_t>(i), e, cancelled_, &fetched);
    if (s.ok() && !e.broken.empty()) s = Status::IOError(e.broken);
    if (s.ok()) s = Commit(target_.root, e);
    if (!s.ok()) {
      problems.emplace_back(fmt::format("'{}': {}", e.file.path, s.message()));
      entries_[i].reset();  // its part file removed
      continue;
    }
    ++cached;
    if (!first) first = &e;
  }
  if (!first) {
    return fmt::format("nothing cached in '{}': {}", target_.root, fmt::join(problems, "; "));
  }
  for (const std::string& side : target_.side_files) {
    Status s = cancelled_ ? CompletionCancelled() : AddSideFile(side);
    if (s.ok()) {
      ++cached;
    } else {
      problems.emplace_back(s.message());
      if (entries_.size() > objects) entries_.resize(objects);
    }
  }
  if (Status ref = WriteRef(first->repo_dir, target_.revision, first->commit); !ref.ok()) {
    problems.emplace_back(ref.message());
  }
  std::string out = fmt::format("cached {} file(s) of {} at {} in '{}'", cached, first->file.repo,
                                first->commit.substr(0, 12), target_.root);
  if (fetched) out += fmt::format(" ({} bytes fetched to complete them)", fetched);
  if (!problems.empty()) out += fmt::format("; left out: {}", fmt::join(problems, "; "));
  return out;
}

}  // namespace loadstone::io
