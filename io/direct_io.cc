#include "io/direct_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace loadstone::io {
namespace {

constexpr uint64_t kAssumedAlign = 4096;

}  // namespace

DirectTwin OpenDirectTwin(const File& buffered) {
  DirectTwin twin;
  struct statfs fs;
  if (::fstatfs(buffered.fd(), &fs) == 0 &&
      (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
    twin.why_not = "in-memory file system";
    return twin;
  }
  uint64_t align = kAssumedAlign;
  struct statx sx;
  std::memset(&sx, 0, sizeof sx);
  if (::statx(buffered.fd(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0) {
    if (sx.stx_dio_offset_align == 0) {
      twin.why_not = "the file system does not support O_DIRECT for it";
      return twin;
    }
    align = std::max<uint64_t>(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
  Result<File> direct = File::OpenForRead(buffered.path(), O_DIRECT);
  if (!direct.ok()) {
    twin.why_not = std::string(direct.status().message());
    return twin;
  }
  twin.file = std::move(direct).value();
  twin.align = align;
  return twin;
}

void BouncePool::Free::operator()(std::byte* p) const { std::free(p); }

BouncePool::BouncePool(size_t count, uint64_t slot_bytes, uint64_t align) {
  if (count == 0 || slot_bytes == 0 || align == 0 || slot_bytes % align != 0) return;
  void* memory = std::aligned_alloc(align, count * slot_bytes);
  if (memory == nullptr) return;
  memory_.reset(static_cast<std::byte*>(memory));
  slot_bytes_ = slot_bytes;
  count_ = count;
  free_.reserve(count);
  for (size_t i = count; i > 0; --i) free_.push_back(static_cast<int>(i - 1));
}

int BouncePool::Acquire() {
  if (free_.empty()) return -1;
  int slot = free_.back();
  free_.pop_back();
  return slot;
}

}  // namespace loadstone::io
