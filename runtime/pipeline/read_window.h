// The read window of one load: its reader (io_uring, else pread) and the reader's completion
// eventfd watched on the load's event loop, and the plan's reads issued in order while fewer than
// a limit are in flight (backpressure: the reader's queue depth, twice over) — in plan order,
// but for the reads Prioritize moved to the front. Used on the event loop only; what each read
// is for stays with the caller (ReadStage, read_stage.h).
#ifndef LOADSTONE_RUNTIME_PIPELINE_READ_WINDOW_H_
#define LOADSTONE_RUNTIME_PIPELINE_READ_WINDOW_H_

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/reader.h"
#include "runtime/pipeline/load_hooks.h"

namespace loadstone::pipeline {

class ReadWindow {
 public:
  // `reads`: how many the plan has; `limit`: how many may be in flight at once.
  ReadWindow(size_t reads, size_t limit) : reads_(reads), limit_(limit) {}

  // Opens the reader (`factory`, else io::OpenReader) on `paths` and watches its completions on
  // `loop`. Errors: the reader's, IOError.
  Status Open(asio::io_context& loop, const std::vector<std::string>& paths,
              const io::ReaderOptions& options, const ReaderFactory& factory);
  bool open() const { return reader_ != nullptr; }
  const io::Reader& reader() const { return *reader_; }  // REQUIRES: open()

  // The next read of the plan, while one is left and there is room for it: the first read
  // moved to the front not yet issued, else the first in plan order not yet issued.
  bool has_next() const { return issued_count_ < reads_ && in_flight_ < limit_; }
  size_t next();
  // The next read is done without the reader (mapped, copied from the page cache).
  void Skip() { MarkIssued(); }
  // Moves the reads `ids` (ascending) that are not issued yet to the front, before those an
  // earlier call moved, in their plan order (a float8 weight's scales, planned before it, stay
  // before it: a read never waits for one issued after it). Returns how many it moved.
  size_t Prioritize(const std::vector<uint64_t>& ids);
  // The next read goes to the reader, with the others of this turn at Flush().
  void Issue(const io::ReadRequest& request);
  void Flush();

  // Calls `handler` (on the loop) once completions may be there to reap; a real read of the
  // eventfd, not a readiness wait, so that one signalled between the last Reap and this call is
  // never missed. Aborted (asio::error::operation_aborted) by Close().
  void Arm(std::function<void(const asio::error_code&)> handler);
  // The reads completed since the last call; each is in flight until Completed() is called
  // for it (so that a failure met while handling one sees the others still out).
  std::vector<io::ReadCompletion>& Reap();
  void Completed() { --in_flight_; }
  size_t in_flight() const { return in_flight_; }

  void Cancel();             // outstanding reads end with Cancelled
  io::ReaderStats Close();   // REQUIRES: nothing in flight. Closes the ring and the files now.
  // io::Reader::Finish, after a load that succeeded. REQUIRES: nothing in flight.
  std::string Finish() { return reader_ ? reader_->Finish() : std::string(); }

 private:
  const size_t reads_;
  const size_t limit_;
  std::unique_ptr<io::Reader> reader_;
  std::unique_ptr<asio::posix::stream_descriptor> completion_fd_;
  uint64_t eventfd_buffer_ = 0;
  std::vector<io::ReadRequest> batch_;
  std::vector<io::ReadCompletion> reaped_;
  void MarkIssued();

  std::vector<bool> issued_ = std::vector<bool>(reads_);
  size_t issued_count_ = 0;
  size_t cursor_ = 0;            // the first read in plan order that may not be issued
  std::deque<uint64_t> front_;   // reads moved to the front, maybe issued since
  size_t in_flight_ = 0;
};

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_READ_WINDOW_H_
