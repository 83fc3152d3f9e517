// The replay driver: each fuzz target linked without libFuzzer runs its LLVMFuzzerTestOneInput
// once on every file of the folders (or files) it is given — the seed corpus and the crashes
// found before, kept as regression inputs — so that ctest (label fuzz) and the sanitizer builds
// check that none of them crashes any more. Exit 0 when every input ran; 2 for a bad argument.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> inputs;
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i])) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
    } else if (fs::is_regular_file(argv[i], ec)) {
      inputs.emplace_back(argv[i]);
    } else if (!fs::exists(argv[i], ec)) {
      continue;  // a target without regressions yet
    } else {
      std::fprintf(stderr, "replay: %s is neither a file nor a folder\n", argv[i]);
      return 2;
    }
    std::sort(inputs.begin(), inputs.end());
    for (const fs::path& p : inputs) {
      std::ifstream in(p, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++ran;
    }
  }
  std::fprintf(stderr, "replay: %zu inputs, none crashed\n", ran);
  return 0;
}
