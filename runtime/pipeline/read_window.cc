#include "runtime/pipeline/read_window.h"

#include <unistd.h>

#include <cerrno>

#include "io/posix_error.h"

namespace loadstone::pipeline {

Status ReadWindow::Open(asio::io_context& loop, const std::vector<std::string>& paths,
                        const io::ReaderOptions& options, const ReaderFactory& factory) {
  std::string log;
  auto reader = factory ? factory(paths, options, &log) : io::OpenReader(paths, options, &log);
  if (!reader.ok()) return reader.status();
  const int fd = ::dup((*reader)->completion_fd());
  if (fd < 0) return io::ErrnoStatus(errno, "cannot watch the reader's completions of", paths[0]);
  reader_ = std::move(*reader);
  completion_fd_ = std::make_unique<asio::posix::stream_descriptor>(loop, fd);
  return Status::OK();
}

size_t ReadWindow::next() {
  while (!front_.empty() && issued_[front_.front()]) front_.pop_front();
  if (!front_.empty()) return front_.front();
  while (cursor_ < reads_ && issued_[cursor_]) ++cursor_;
  return cursor_;
}

void ReadWindow::MarkIssued() {
  const size_t id = next();
  issued_[id] = true;
  ++issued_count_;
}

size_t ReadWindow::Prioritize(const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> moved;
  for (uint64_t id : ids) {
    if (id < reads_ && !issued_[id]) moved.push_back(id);
  }
  front_.insert(front_.begin(), moved.begin(), moved.end());
  return moved.size();
}

void ReadWindow::Issue(const io::ReadRequest& request) {
  MarkIssued();
  batch_.push_back(request);
  ++in_flight_;
}

void ReadWindow::Flush() {
  if (batch_.empty()) return;
  reader_->Submit(batch_);
  batch_.clear();
}

void ReadWindow::Arm(std::function<void(const asio::error_code&)> handler) {
  completion_fd_->async_read_some(
      asio::buffer(&eventfd_buffer_, sizeof(eventfd_buffer_)),
      [handler = std::move(handler)](const asio::error_code& ec, size_t) { handler(ec); });
}

std::vector<io::ReadCompletion>& ReadWindow::Reap() {
  reaped_.clear();
  reader_->Reap(&reaped_);
  return reaped_;
}

void ReadWindow::Cancel() {
  if (reader_) reader_->Cancel();
}

io::ReaderStats ReadWindow::Close() {
  completion_fd_.reset();  // aborts the pending wait
  io::ReaderStats stats;
  if (reader_) stats = reader_->stats();
  reader_.reset();
  return stats;
}

}  // namespace loadstone::pipeline
