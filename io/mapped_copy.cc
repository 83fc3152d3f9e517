#include "io/mapped_copy.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loadstone::io {
namespace {

// What a thread's copy is guarding: its source range and where to jump back to.
struct Guard {
  sigjmp_buf jump;
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
  // Set by the handler before it jumps; volatile, as a local changed between sigsetjmp and
  // siglongjmp must be to be read after the jump.
  const std::byte* volatile fault = nullptr;
};

// Read by the signal handler: initial-exec, so that reading it there never allocates.
__attribute__((tls_model("initial-exec"))) thread_local Guard* t_guard = nullptr;

std::mutex g_install_mu;
bool g_installed = false;           // guarded by g_install_mu
// The disposition before ours: written (under g_install_mu) before ours is installed, so that the
// handler never reads it unset, and rewritten only if another one slipped in between.
struct sigaction g_previous {};

void OnSigbus(int sig, siginfo_t* info, void* context) {
  Guard* guard = t_guard;
  const auto* at = static_cast<const std::byte*>(info->si_addr);
  // si_code > 0: raised by the kernel for a fault, not sent by kill() or sigqueue().
  if (guard != nullptr && info->si_code > 0 && at >= guard->begin && at < guard->end) {
    guard->fault = at;
    t_guard = nullptr;
    siglongjmp(guard->jump, 1);
  }
  // Not a copy of ours: what would have happened without this handler. SIG_DFL and SIG_IGN are
  // tested first, whatever the flags say (a runtime may restore them with SA_SIGINFO still set).
  if (g_previous.sa_handler == SIG_IGN) {
    if (info->si_code <= 0) return;  // an ignored signal that was sent stays ignored
  } else if (g_previous.sa_handler != SIG_DFL) {
    if ((g_previous.sa_flags & SA_SIGINFO) != 0) {
      g_previous.sa_sigaction(sig, info, context);
    } else {
      g_previous.sa_handler(sig);
    }
    return;
  }
  // The default action: restored, then the faulting access runs again and takes it (a signal
  // that was sent is sent again).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(SIGBUS, &fallback, nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

bool HandlerInForce() {
  struct sigaction now {};
  return ::sigaction(SIGBUS, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) != 0 &&
         now.sa_sigaction == &OnSigbus;
}

#if defined(__x86_64__)
// 64 bytes a step, stored around the caches; the head up to `to`'s 32-byte alignment and the
// tail below 64 bytes are plain copies.
__attribute__((target("avx2"))) void StreamAvx2(std::byte* to, const std::byte* from, uint64_t n) {
  const uint64_t head = (32 - reinterpret_cast<uintptr_t>(to) % 32) % 32;
  if (head >= n) {
    std::memcpy(to, from, n);
    return;
  }
  std::memcpy(to, from, head);
  uint64_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 32), b);
  }
  std::memcpy(to + i, from + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: visible to other threads from here on
}
#endif

// Below this a plain memcpy: the destination likely stays in the caches, where it is wanted.
constexpr uint64_t kStreamMin = 256 << 10;

void Copy(std::byte* to, const std::byte* from, uint64_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && n >= kStreamMin) return StreamAvx2(to, from, n);
#endif
  std::memcpy(to, from, n);
}

}  // namespace

Status PrepareMappedCopy() {
  std::lock_guard lock(g_install_mu);
  if (!g_installed) {
    struct sigaction ours {};
    ours.sa_sigaction = &OnSigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    struct sigaction before {}, replaced {};
    if (::sigaction(SIGBUS, nullptr, &before) != 0 ||
        (g_previous = before, ::sigaction(SIGBUS, &ours, &replaced) != 0)) {
      return Status::Unsupported(fmt::format(
          "copies from the page cache are not guarded: installing a SIGBUS handler failed ({})",
          std::strerror(errno)));
    }
    // Another thread of the program changed it between the two calls: chain to that one.
    if (replaced.sa_handler != before.sa_handler) g_previous = replaced;
    g_installed = true;
  }
  if (!HandlerInForce()) {
    return Status::Unsupported(
        "copies from the page cache are not guarded: another SIGBUS handler replaced loadstone's "
        "(io/mapped_copy.h); reads into existing memory go through the reader instead");
  }
  return Status::OK();
}

Status CopyFromMapping(std::byte* to, const std::byte* from, uint64_t n, uint64_t file_offset) {
  // Checked per copy (one syscall per piece of 4 MiB or less): a handler that replaced ours during
  // a load would otherwise let a lost page crash the process.
  if (!HandlerInForce()) {
    return Status::Unsupported(
        "another SIGBUS handler replaced loadstone's during the load, so a copy out of the page "
        "cache is no longer guarded (io/mapped_copy.h); load again");
  }
  Guard guard;
  guard.begin = from;
  guard.end = from + n;
  // 1: the signal mask is saved and restored by the jump, so SIGBUS is not left blocked.
  if (sigsetjmp(guard.jump, 1) != 0) {
    const uint64_t page = 4096;
    const uint64_t at = static_cast<uint64_t>(guard.fault - from);
    return Status::IOError(fmt::format(
        "the page at byte {} of the file could not be read through its mapping (SIGBUS: the file "
        "shrank while loading, or an I/O error)",
        (file_offset + at) / page * page));
  }
  t_guard = &guard;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  Copy(to, from, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return Status::OK();
}

}  // namespace loadstone::io
