// ScanJson against nlohmann's sax_parse on any text (tests/testing/json_events.h): the first
// byte picks the event a handler refuses (0: none), the rest is the text. Any break of the
// contract aborts.
#include <cstdio>
#include <cstdlib>

#include "fuzz_input.h"
#include "tests/testing/json_events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t refuse_at = data[0] == 0 ? std::numeric_limits<size_t>::max() : data[0];
  const auto check = loadstone::testing::CheckScan(loadstone::fuzz::AsText(data + 1, size - 1),
                                                   refuse_at);
  if (!check.broken.empty()) {
    std::fprintf(stderr, "json scan breaks its contract: %s\n", check.broken.c_str());
    std::abort();
  }
  return 0;
}
