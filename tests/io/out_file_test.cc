// OutFile::CopyFrom: a byte range of one file appended to another inside the kernel, and an
// error naming both files when the source ends first.
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

#include "io/out_file.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("out file: CopyFrom appends a range of another file, byte for byte", "[io]") {
  testing::TempDir dir;
  std::string source(3 << 20, '\0');
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>(i * 7 + i / 4096);
  const std::string from = dir.Path("source");
  std::ofstream(from, std::ios::binary) << source;
  auto file = io::File::OpenForRead(from);
  REQUIRE(file.ok());
  io::OutFile out;
  const std::string to = dir.Path("copy");
  REQUIRE(out.Open(to).ok());
  REQUIRE(out.Write(std::string_view("head")).ok());
  REQUIRE(out.CopyFrom(*file, 12345, 2 << 20).ok());
  CHECK(out.offset() == 4 + (2 << 20));
  REQUIRE(out.Close().ok());
  CHECK(Slurp(to) == "head" + source.substr(12345, 2 << 20));
}

TEST_CASE("out file: CopyFrom past the source's end is Corruption naming it", "[io]") {
  testing::TempDir dir;
  const std::string from = dir.Path("short");
  std::ofstream(from, std::ios::binary) << std::string(1000, 'x');
  auto file = io::File::OpenForRead(from);
  REQUIRE(file.ok());
  io::OutFile out;
  REQUIRE(out.Open(dir.Path("copy")).ok());
  const Status s = out.CopyFrom(*file, 900, 200);
  CHECK(s.code() == StatusCode::kCorruption);
  CHECK_THAT(std::string(s.message()), Catch::Contains("short") && Catch::Contains("ends at 1000"));
}

}  // namespace loadstone
