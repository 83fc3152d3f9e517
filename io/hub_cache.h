// HubCache: the Hugging Face cache written as a load streams (io/http_reader.h's tee), in
// huggingface_hub's layout, so that the next start reads local files and huggingface_hub (and
// transformers, diffusers) finds them too:
//
//   ROOT/models--ORG--REPO/blobs/ETAG               the file's bytes (ETAG: X-Linked-Etag, an
//                                                   LFS file's sha256, else ETag; no quotes)
//   ROOT/models--ORG--REPO/snapshots/COMMIT/PATH     a relative symlink to ../../blobs/ETAG
//   ROOT/models--ORG--REPO/refs/REVISION             COMMIT, when the revision asked was a name
//   ROOT/.locks/models--ORG--REPO/ETAG.lock          flock'ed while a blob is put in place, as
//                                                    huggingface_hub's filelock does
//
// While the load runs, each object's verified bytes (every range answered 206 with the probe's
// version) are written as they arrive into a part file of its own beside the blob
// (blobs/ETAG.PID.loadstone-part: never huggingface_hub's ETAG.incomplete, which it resumes as
// a prefix). Finish(), after a load whose every read succeeded, fetches what the load did not
// read (headers, tensors left out), checked against the same version, renames each whole
// part file to its blob, links the snapshot and writes the ref; it also caches the load's
// index and config.json. A blob, link or ref already there is left as it is (another process
// made it). Nothing of the cache fails the load: what went wrong is in Finish()'s sentence.
// A HubCache destroyed before Finish() — a load failed or cancelled — removes its part files.
//
// Thread safety: Wrote() from any thread; Finish() once, when no Wrote() runs; Cancel() from any
// thread.
#ifndef LOADSTONE_IO_HUB_CACHE_H_
#define LOADSTONE_IO_HUB_CACHE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/http_reader.h"
#include "loadstone/status.h"

namespace loadstone::io {


// InvalidArgument for a cache asked for `location` (an address, or `local`: a file), which is
// not one of the Hub's files: what the cache takes, and to leave it out.
Status NotAHubFile(const std::string& location, bool local);

class HubCache {
 public:
  // For a reader's objects (file i is objects[i]). Errors: InvalidArgument naming an object
  // that is not a Hub file (the cache is huggingface_hub's: hf:// addresses only). An object
  // whose blob is already there is not written again; one the cache cannot take (no version
  // to name its blob, a folder it may not write) is left out, said in Finish()'s sentence.
  static Result<std::shared_ptr<HubCache>> Create(const HubCacheTarget& target,
                                                  const std::vector<HttpObject>& objects);
  ~HubCache();
  HubCache(const HubCache&) = delete;
  HubCache& operator=(const HubCache&) = delete;

  // `bytes` of `file` at `offset` came, verified. A write that fails (a full disk) drops that
  // object from the cache, its part file removed at Finish().
  void Wrote(uint32_t file, uint64_t offset, std::span<const std::byte> bytes);

  // Completes the cache (see the top); returns what it did, for the user: "cached N files of
  // ORG/REPO at COMMIT in ROOT (B fetched to complete them)", with what it left out and why.
  std::string Finish();
  // Thread-safe: Finish() stops at its next step (a chunk of a gap, an object) and commits
  // nothing more; what it had put in place stays.
  void Cancel() { cancelled_ = true; }

  struct Entry;  // one object's part file and what of it has been written

 private:
  HubCache() = default;
  // Reads the Hub file `url` (an index, a config) whole into the cache.
  Status AddSideFile(const std::string& url);
  HubCacheTarget target_;
  std::vector<std::unique_ptr<Entry>> entries_;  // per file; null for one left out
  std::vector<std::string> left_out_;            // why, per object left out at Create
  std::atomic<bool> cancelled_{false};
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_HUB_CACHE_H_
