#include "tools/loadstone/progress_bar.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "tools/loadstone/format.h"

namespace loadstone::cli {
namespace {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void OnInterrupt(int) { g_interrupted.store(true); }

}  // namespace

std::string RenderProgress(const Progress& p, int columns) {
  const size_t width = static_cast<size_t>(std::max(columns, 2) - 1);
  const double fraction =
      p.bytes_to_place ? std::clamp(double(p.bytes_placed) / double(p.bytes_to_place), 0.0, 1.0)
                       : 1.0;
  // Parts in the order they are dropped when the line does not fit.
  const std::string percent = fmt::format("{:5.1f}%", 100 * fraction);
  const std::string bytes =
      fmt::format(" {} / {}", HumanBytes(p.bytes_placed), HumanBytes(p.bytes_to_place));
  const std::string rate = fmt::format("  {:.2f} GB/s", p.read_gbps);
  const std::string eta = p.eta_seconds > 0 ? fmt::format("  ETA {:.1f} s", p.eta_seconds) : "";
  constexpr size_t kMinBar = 10;
  std::string text;
  for (int parts = 4; parts >= 0; --parts) {
    text = percent + (parts >= 2 ? bytes : "") + (parts >= 3 ? rate : "") + (parts >= 4 ? eta : "");
    if (parts == 0 || text.size() + 3 + kMinBar <= width) break;
  }
  if (text.size() + 3 + kMinBar > width) return text.substr(0, width);  // no room for a bar
  const size_t bar = std::min<size_t>(width - text.size() - 3, 40);
  const auto filled = static_cast<size_t>(fraction * static_cast<double>(bar));
  std::string line;
  line.reserve(width);
  line.append("[").append(filled, '#').append(bar - filled, '.').append("] ").append(text);
  return line;
}

int TerminalColumns() {
  struct winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* env = std::getenv("COLUMNS")) {
    int n = 0;
    auto [ptr, ec] = std::from_chars(env, env + std::strlen(env), n);
    if (ec == std::errc() && n > 0) return n;
  }
  return 80;
}

struct sigaction g_previous{};  // SIGINT's disposition before InterruptToCancel

InterruptToCancel::InterruptToCancel() {
  g_interrupted.store(false);
  ::sigaction(SIGINT, nullptr, &g_previous);
  if (g_previous.sa_handler == SIG_IGN) return;  // a background job: SIGINT stays ignored
  struct sigaction action{};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  // SA_RESETHAND: a second Ctrl-C is the default, the process ends. SA_RESTART: a write to the
  // terminal that the signal interrupts is restarted; without it the write fails with EINTR,
  // std::cerr turns bad and every later line (the "cancelled" summary) is silently dropped.
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
}

InterruptToCancel::~InterruptToCancel() { ::sigaction(SIGINT, &g_previous, nullptr); }

bool InterruptToCancel::interrupted() const { return g_interrupted.load(); }

void DrawProgress(const Progress& progress) {
  // One write per frame: a terminal never shows half a frame.
  std::string frame = "\r";
  frame += RenderProgress(progress, TerminalColumns());
  frame += "\x1b[K";
  std::cerr << frame << std::flush;
}

WaitResult WaitWithProgress(LoadHandle& load, bool show, const InterruptToCancel* interrupt) {
  WaitResult result;
  // A Ctrl-C, once: the load is cancelled and the line ended after the terminal's "^C", so that
  // no frame is drawn over it.
  auto notice_interrupt = [&] {
    if (!interrupt || !interrupt->interrupted() || result.interrupted) return;
    result.interrupted = true;
    load.Cancel();
    if (show) std::cerr << "\n" << std::flush;
  };
  auto done = load.Done();
  auto last_draw = std::chrono::steady_clock::now();
  // Ctrl-C is looked for every 20 ms, the line redrawn every 100 ms.
  while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    notice_interrupt();
    const auto now = std::chrono::steady_clock::now();
    if (show && !result.interrupted && now - last_draw >= std::chrono::milliseconds(100)) {
      last_draw = now;
      DrawProgress(load.progress());
    }
  }
  notice_interrupt();  // a Ctrl-C as the load ended (cancelling a finished load does nothing)
  if (show && !result.interrupted) {
    DrawProgress(load.progress());
    std::cerr << "\n";
  }
  result.status = done.get();
  return result;
}

std::string CancelledLine(const Progress& p) {
  return fmt::format(
      "cancelled (Ctrl-C) after {:.3f} s: {} of {} tensors in place, {} of {} placed; nothing "
      "is kept",
      p.seconds, p.tensors_done, p.tensors_total, HumanBytes(p.bytes_placed),
      HumanBytes(p.bytes_to_place));
}

}  // namespace loadstone::cli
