#include "io/posix_error.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace loadstone::io {
namespace {

std::string_view Hint(int err) {
  switch (err) {
    case EACCES:
    case EPERM: return " (check the file's permissions and the user running loadstone)";
    case EMFILE:
    case ENFILE: return " (too many open files: raise `ulimit -n`)";
    case ENOSPC: return " (the disk is full)";
    case EISDIR: return " (a folder was given where a file was expected)";
    case EINVAL: return " (the file system may not support this kind of read; try --backend pread)";
    default: return "";
  }
}

StatusCode CodeFor(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return StatusCode::kNotFound;
    case ENOMEM: return StatusCode::kOutOfMemory;
    case ECANCELED: return StatusCode::kCancelled;
    default: return StatusCode::kIOError;
  }
}

}  // namespace

Status ErrnoStatus(int err, std::string_view what, std::string_view path) {
  return Status(CodeFor(err),
                fmt::format("{} '{}': {}{}", what, path, std::strerror(err), Hint(err)));
}

Status ErrnoStatus(int err, std::string_view what) {
  return Status(CodeFor(err), fmt::format("{}: {}", what, std::strerror(err)));
}

}  // namespace loadstone::io
