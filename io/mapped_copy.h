// Copying out of a file mapping (Reader::CachedView) from user space without the crash that
// normally comes with it. A page of a mapping that the kernel cannot read — the file shrank under
// the copy, an I/O error — raises SIGBUS in the thread that touches it. CopyFromMapping arms a
// per-thread guard over its source range, and a process-wide SIGBUS handler (installed by the
// first PrepareMappedCopy) turns a fault inside that range into an IOError for that copy. Any
// other SIGBUS goes where it would have gone without loadstone: to the handler that was installed
// before ours, else to the default action (the process dies).
//
// Why copy from user space at all: the destination is then written with streaming
// (non-temporal) stores, which skip reading each destination line before writing it: into memory
// that already exists (a hot swap of parameters) that is well above what pread's kernel copy
// reaches on the same cores (bench/README.md, "the hot swap by streaming copy").
//
// The handler stays installed for the life of the process: libloadstone.so is linked with
// -z nodelete, so that a dlclose never leaves the handler pointing at unmapped code. Its
// thread-local guard is initial-exec TLS (8 bytes of glibc's static surplus when dlopen'ed).
//
// An embedding program that replaces the SIGBUS handler after us without chaining to it turns the
// guard off: PrepareMappedCopy then says so and loads route around these copies, and a copy that
// finds it replaced mid-load fails (Unsupported) instead of risking the crash.
#ifndef LOADSTONE_IO_MAPPED_COPY_H_
#define LOADSTONE_IO_MAPPED_COPY_H_

#include <cstddef>
#include <cstdint>

#include "loadstone/status.h"

namespace loadstone::io {

// OK when copies from mappings are guarded in this process: installs the handler on first use,
// then checks that it is still the one in force. Else Unsupported, saying why. Thread-safe.
Status PrepareMappedCopy();

// Copies [from, from + n), which lies in a read-only mapping of a file, to `to` (any memory of
// the caller's; it must not overlap), with streaming stores where the CPU has them (x86-64 AVX2;
// else memcpy), and makes the stores visible before returning. IOError when a page of the source
// could not be read, naming `file_offset` + the failing page's place (the offset of `from` in
// its file); `to` then holds an unspecified prefix of the bytes. REQUIRES: PrepareMappedCopy()
// returned OK. Thread-safe (each thread its own guard).
Status CopyFromMapping(std::byte* to, const std::byte* from, uint64_t n, uint64_t file_offset);

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_MAPPED_COPY_H_
