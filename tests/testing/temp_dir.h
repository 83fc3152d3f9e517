// A temporary folder removed at the end of the test, and helpers to write raw files into it.
#ifndef LOADSTONE_TESTS_TESTING_TEMP_DIR_H_
#define LOADSTONE_TESTS_TESTING_TEMP_DIR_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace loadstone::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loadstone-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Path(std::string_view name) const { return path_ + "/" + std::string(name); }

  // Writes `bytes` to `name` (creating parent folders) and returns the full path.
  std::string Write(std::string_view name, std::string_view bytes) const {
    std::string full = Path(name);
    std::filesystem::create_directories(std::filesystem::path(full).parent_path());
    std::ofstream(full, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return full;
  }

 private:
  std::string path_;
};

// 8-byte little-endian length prefix.
inline std::string LE64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

// [LE64(json.size())][json][data_bytes zero bytes]
inline std::string SafetensorsBytes(std::string_view json, size_t data_bytes) {
  return LE64(json.size()) + std::string(json) + std::string(data_bytes, '\0');
}

// Writes `path` back and drops it from the page cache, so that reads go to the device.
// False when the file cannot be opened.
inline bool DropFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return true;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_TEMP_DIR_H_
