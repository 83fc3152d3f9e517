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
#include "tests/runtime/pipeline/test_platform.h"

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

// Loader options under which every load sees cold files; `faults` (if any) are injected under
// that while `*faults_on` holds (null: always).
inline LoaderOptions ColdReads(std::atomic<int>* asked, io::FaultOptions faults = {},
                               LoaderOptions options = {},
                               std::shared_ptr<std::atomic<bool>> faults_on = nullptr) {
  LoadHooks hooks;
  hooks.open_reader =
      [asked, faults, faults_on](const std::vector<std::string>& paths, const io::ReaderOptions& o,
                                     std::string* log) -> Result<std::unique_ptr<io::Reader>> {
        LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, o, log));
        const io::FaultOptions none;
        LOADSTONE_ASSIGN_OR_RETURN(
            auto faulty, io::FaultInjectingReader::Create(std::move(inner), paths,
                                                          !faults_on || *faults_on ? faults : none));
        return std::unique_ptr<io::Reader>(std::make_unique<ColdReader>(std::move(faulty), asked));
      };
  options.hooks = std::make_shared<const LoadHooks>(std::move(hooks));
  return options;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_RUNTIME_PIPELINE_COLD_READER_H_
