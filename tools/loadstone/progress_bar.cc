#include "tools/loadstone/progress_bar.h"

#include <chrono>
#include <iostream>

#include <fmt/format.h>

#include "tools/loadstone/format.h"

namespace loadstone::cli {
namespace {

void Draw(const Progress& p) {
  constexpr int kWidth = 30;
  const double fraction = p.bytes_total ? double(p.bytes_placed) / double(p.bytes_total) : 1.0;
  const int filled = static_cast<int>(fraction * kWidth);
  std::cerr << fmt::format("\r[{}{}] {:>5.1f}% {} / {}  {:.2f} GB/s  ETA {:.1f} s  ",
                           std::string(filled, '#'), std::string(kWidth - filled, '.'),
                           100 * fraction, HumanBytes(p.bytes_placed), HumanBytes(p.bytes_total),
                           p.read_gbps, p.eta_seconds)
            << std::flush;
}

}  // namespace

Status WaitWithProgress(const LoadHandle& load, bool show) {
  auto done = load.Done();
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (show) Draw(load.progress());
  }
  if (show) {
    Draw(load.progress());
    std::cerr << "\n";
  }
  return done.get();
}

}  // namespace loadstone::cli
