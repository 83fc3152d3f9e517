// The live progress line while a load runs, and Ctrl-C as a cancel.
#ifndef LOADSTONE_TOOLS_PROGRESS_BAR_H_
#define LOADSTONE_TOOLS_PROGRESS_BAR_H_

#include <string>

#include "loadstone/loader.h"

namespace loadstone::cli {

// One progress line of at most `columns - 1` characters (a line as wide as the terminal would
// wrap on some terminals): "[####....] 45.3% 1.20 GiB / 2.60 GiB  1.23 GB/s  ETA 3.4 s", the
// fraction being bytes placed over bytes to place, never past 100%. On a narrow terminal the
// ETA, then the rate, then the byte counts, then the bar are left out.
std::string RenderProgress(const Progress& progress, int columns);

// Redraws the progress line on stderr: RenderProgress at the terminal's width, over the last one.
void DrawProgress(const Progress& progress);

// The width of the terminal on stderr (TIOCGWINSZ), else $COLUMNS, else 80.
int TerminalColumns();

// SIGINT, while one lives, asks the running load to cancel instead of killing the process; a
// second Ctrl-C kills it as usual; an ignored SIGINT (a background job) stays ignored. Its
// destruction restores what SIGINT did before. A system call the signal interrupts is restarted
// (SA_RESTART), so that output to the terminal goes on. Not nestable.
class InterruptToCancel {
 public:
  InterruptToCancel();
  ~InterruptToCancel();
  InterruptToCancel(const InterruptToCancel&) = delete;
  InterruptToCancel& operator=(const InterruptToCancel&) = delete;

  bool interrupted() const;
};

struct WaitResult {
  Status status;
  bool interrupted = false;  // Ctrl-C cancelled the load
};

// Waits for `load` to finish. When `show`, redraws the line on stderr every 100 ms, fitted to
// the terminal's width at each redraw, and ends it with a newline. When `interrupt` is given and
// Ctrl-C comes, cancels the load and waits for it to stop; the line is ended at once (after the
// terminal's "^C") and not drawn again.
WaitResult WaitWithProgress(LoadHandle& load, bool show, const InterruptToCancel* interrupt);

// What `load` and `demo` print when Ctrl-C cancelled a load: "cancelled (Ctrl-C) after S s: N of
// M tensors in place, X of Y placed; nothing is kept".
std::string CancelledLine(const Progress& progress);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_PROGRESS_BAR_H_
