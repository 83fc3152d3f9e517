// A reader that calls every range cold, for tests of the staged cold-read path.
#ifndef LOADSTONE_TESTS_RUNTIME_PIPELINE_COLD_READER_H_
#define LOADSTONE_TESTS_RUNTIME_PIPELINE_COLD_READER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "io/fault_reader.h"
#include "io/reader_wrapper.h"
#include "loadstone/loader.h"
#include "runtime/pipeline/testing.h"

namespace loadstone::testing {

// Says every range is cold (as on a disk after a cache drop), whatever the page cache holds.
class ColdReader final : public io::ReaderWrapper {
 public:
  ColdReader(std::unique_ptr<io::Reader> inner, std::atomic<int>* asked)
      : ReaderWrapper(std::move(inner)), asked_(asked) {}
  bool ReadsDirect(uint32_t, uint64_t, uint64_t) const override {
    asked_->fetch_add(1);
    return true;
  }

 private:
  std::atomic<int>* asked_;
};

// Makes every load on `loader` see cold files; `faults` (if any) are injected under that.
inline void UseColdReader(Loader& loader, std::atomic<int>* asked, io::FaultOptions faults = {}) {
  pipeline::SetReaderFactoryForTesting(
      loader,
      [asked, faults](const std::vector<std::string>& paths, const io::ReaderOptions& o,
                      std::string* log) -> Result<std::unique_ptr<io::Reader>> {
        LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, o, log));
        LOADSTONE_ASSIGN_OR_RETURN(
            auto faulty, io::FaultInjectingReader::Create(std::move(inner), paths, faults));
        return std::unique_ptr<io::Reader>(std::make_unique<ColdReader>(std::move(faulty), asked));
      });
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_COLD_READER_H_
