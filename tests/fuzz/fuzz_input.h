// What the fuzz targets share: the fuzzer's bytes as a file for the parsers that read files
// (a fresh name under one per-process folder in /dev/shm, so each input is its own file and a
// cached catalog can never answer for the last one), and a Status that must carry a message.
#ifndef LOADSTONE_TESTS_FUZZ_FUZZ_INPUT_H_
#define LOADSTONE_TESTS_FUZZ_FUZZ_INPUT_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "io/file.h"
#include "loadstone/status.h"

namespace loadstone::fuzz {

// The bytes [data, data + size) written to FOLDER/`name`; the folder is this process's, made on
// first use and removed at exit.
inline std::string WriteInput(const uint8_t* data, size_t size, const std::string& name) {
  static const std::filesystem::path folder = [] {
    std::filesystem::path p = std::filesystem::path(std::filesystem::exists("/dev/shm")
                                                        ? "/dev/shm"
                                                        : std::filesystem::temp_directory_path()) /
                              ("loadstone-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    static const std::filesystem::path removed = p;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removed, ec);
    });
    return p;
  }();
  const std::filesystem::path path = folder / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path.string();
}

// WriteInput's file, opened for reading (a file it just wrote always opens).
inline io::File InputFile(const uint8_t* data, size_t size, const std::string& name) {
  auto file = io::File::OpenForRead(WriteInput(data, size, name));
  if (!file.ok()) {
    std::fprintf(stderr, "cannot open the input: %s\n", file.status().ToString().c_str());
    std::abort();
  }
  return std::move(file).value();
}

// The folder WriteInput writes into (for the parsers that take a folder).
inline std::string InputFolder(const std::string& written) {
  return std::filesystem::path(written).parent_path().string();
}

// An error a parser returns must say something: an empty message is a bug of its own.
inline void CheckRefusal(const Status& status) {
  if (!status.ok() && status.message().empty()) {
    std::fprintf(stderr, "a refusal without a message: %s\n", status.ToString().c_str());
    std::abort();
  }
}

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace loadstone::fuzz

#endif  // LOADSTONE_TESTS_FUZZ_FUZZ_INPUT_H_
