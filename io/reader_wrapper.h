// ReaderWrapper: a Reader that forwards every call to another one (LevelDB's EnvWrapper
// pattern), so a test double overrides only what it changes.
#ifndef LOADSTONE_IO_READER_WRAPPER_H_
#define LOADSTONE_IO_READER_WRAPPER_H_

#include <memory>
#include <utility>

#include "io/reader.h"

namespace loadstone::io {

class ReaderWrapper : public Reader {
 public:
  // REQUIRES: inner != nullptr.
  explicit ReaderWrapper(std::unique_ptr<Reader> inner) : inner_(std::move(inner)) {}

  Reader* inner() const { return inner_.get(); }

  std::string Describe() const override { return inner_->Describe(); }
  void Submit(std::span<const ReadRequest> requests) override { inner_->Submit(requests); }
  size_t Reap(std::vector<ReadCompletion>* out) override { return inner_->Reap(out); }
  int completion_fd() const override { return inner_->completion_fd(); }
  size_t pending() const override { return inner_->pending(); }
  void Cancel() override { inner_->Cancel(); }
  ReaderStats stats() const override { return inner_->stats(); }
  bool ReadsDirect(uint32_t file, uint64_t offset, uint64_t length) const override {
    return inner_->ReadsDirect(file, offset, length);
  }
  // Not forwarded: copies from the view would bypass whatever the wrapper does to reads.
  const std::byte* CachedView(uint32_t, uint64_t, uint64_t) const override { return nullptr; }
  Result<uint64_t> SizeNow(uint32_t file) const override { return inner_->SizeNow(file); }
  std::string Finish() override { return inner_->Finish(); }

 private:
  std::unique_ptr<Reader> inner_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_READER_WRAPPER_H_
