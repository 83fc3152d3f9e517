// errno → Status, in one place.
#ifndef LOADSTONE_IO_POSIX_ERROR_H_
#define LOADSTONE_IO_POSIX_ERROR_H_

#include <string_view>

#include "loadstone/status.h"

namespace loadstone::io {

// `what` says what failed ("open", "read 4096 bytes at offset 8"), `path` which file. The code
// follows errno (ENOENT → NotFound, ENOMEM → OutOfMemory, ECANCELED → Cancelled, otherwise
// IOError) and the message ends with the fix where one is known (EACCES, EMFILE, ENOSPC, ...).
Status ErrnoStatus(int err, std::string_view what, std::string_view path);
// The same for a call that involves no file ("registering 8 bytes with userfaultfd"): the code
// follows errno, the message is `what: strerror`.
Status ErrnoStatus(int err, std::string_view what);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_POSIX_ERROR_H_
