// FaultInjectingReader: wraps any Reader and makes it misbehave on purpose, for tests of the
// layers above (the pipeline must turn each of these into a clean error or a correct load).
//
//   - EIO: a request covering a chosen byte of a chosen file fails with IOError naming the
//     path and offsets, as a bad sector would.
//   - Truncation: a file behaves as if it ended at a chosen size: requests reaching past it
//     fail with the same Corruption error a real truncated file gives.
//   - Slow reads: every completion is held back by `latency`.
//   - Out of order: completions are collected up to `reorder_window` at a time and handed out
//     shuffled (seeded, so a failure can be replayed).
//
// Requests are still forwarded to the wrapped reader (so `dst` is written as a real failed
// read might write it); only the statuses and timing change.
//
// Thread safety: as Reader. A helper thread moves completions from the wrapped reader to this
// one's completion_fd(). Destruction stops that thread, then destroys the wrapped reader
// (which cancels and waits).
#ifndef LOADSTONE_IO_FAULT_READER_H_
#define LOADSTONE_IO_FAULT_READER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/reader_wrapper.h"

namespace loadstone::io {

struct FaultOptions {
  struct FileByte {
    uint32_t file = 0;
    uint64_t byte = 0;
  };
  std::vector<FileByte> eio_at;       // requests covering one of these bytes fail with EIO
  std::vector<FileByte> truncate_at;  // `file` acts as if it ended at `byte`
  std::chrono::microseconds latency{0};
  size_t reorder_window = 0;  // > 1: hand out completions shuffled, this many at a time
  uint64_t seed = 1;
};

class FaultInjectingReader final : public ReaderWrapper {
 public:
  // `paths` are the wrapped reader's files, for the error messages.
  // Errors: IOError when the eventfds cannot be created.
  static Result<std::unique_ptr<FaultInjectingReader>> Create(std::unique_ptr<Reader> inner,
                                                              std::vector<std::string> paths,
                                                              FaultOptions options);
  ~FaultInjectingReader() override;

  std::string Describe() const override;
  void Submit(std::span<const ReadRequest> requests) override;
  size_t Reap(std::vector<ReadCompletion>* out) override;
  int completion_fd() const override;
  size_t pending() const override;

  // Requests whose status was replaced by an injected fault so far.
  uint64_t injected() const;

 private:
  struct State;
  FaultInjectingReader(std::unique_ptr<Reader> inner, std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FAULT_READER_H_
