// ParseSizeString: accelerate's convert_file_size_to_int.
#include <catch2/catch.hpp>

#include "loadstone/device_map.h"
#include "runtime/device_map/py_number.h"

namespace loadstone {
namespace {

uint64_t Size(const char* text) {
  auto r = ParseSizeString(text);
  INFO(text << ": " << r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

TEST_CASE("size strings: the spec's cases", "[planner][size]") {
  CHECK(Size("0MB") == 0);
  CHECK(Size("100MB") == 100'000'000);
  CHECK(Size("2GiB") == (1ULL << 31));
  CHECK(Size("512KiB") == (1ULL << 19));
  CHECK(Size("1.5GB") == 1'500'000'000);
  CHECK(Size("100KB") == 100'000);
  CHECK(Size("10GiB") == 10ULL << 30);
  CHECK(Size("10GB") == 10'000'000'000ULL);
}

TEST_CASE("size strings: a lowercase final b means bits, for decimal units only", "[planner][size]") {
  CHECK(Size("5MB") == 5'000'000);
  CHECK(Size("5Mb") == 625'000);
  CHECK(Size("5mb") == 625'000);
  CHECK(Size("5gb") == 625'000'000);
  CHECK(Size("5kb") == 625);
  CHECK(Size("1kb") == 125);
  CHECK(Size("3kb") == 375);
  CHECK(Size("1KB") == 1000);
  CHECK(Size("5MiB") == 5ULL << 20);
  CHECK(Size("5mib") == 5ULL << 20);  // binary units: no bits rule
  CHECK(Size("5Gib") == 5ULL << 30);
}

TEST_CASE("size strings: numbers as Python's float() reads them", "[planner][size]") {
  CHECK(Size(" 5 MB") == 5'000'000);
  CHECK(Size("1_000KB") == 1'000'000);
  CHECK(Size("1e3KB") == 1'000'000);
  CHECK(Size(".5GB") == 500'000'000);
  CHECK(Size("5.GB") == 5'000'000'000ULL);
  CHECK(Size("+2KiB") == 2048);
  CHECK(Size("0.1KB") == 100);
  CHECK(Size("1.1KB") == 1100);
  CHECK(Size("0.3KiB") == 307);                 // int(0.3 * 1024) = int(307.2)
  CHECK(Size("-0.0000000001GB") == 0);          // int(-0.1) == 0, not negative
  CHECK(Size("487.9KB") == 487'900);
  CHECK(Size("0.2KB") == 200);
  CHECK(Size("3731.5KB") == 3'731'500);
}

TEST_CASE("size strings: errors carry accelerate's message", "[planner][size]") {
  for (const char* bad : {"100", "5TB", "5B", "5MBB", "5k0MB", "-1GB", "GB", "", "1__0MB", "_1MB",
                          "1_MB", "infGB", "nanMB", "5 M B", "1e400GB", "0x10MB", "-8mb"}) {
    auto r = ParseSizeString(bad);
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message() ==
          "`size` " + std::string(bad) +
              " is not in a valid format. Use an integer for bytes, or a string with an unit (like "
              "'5.0GB').");
  }
}

TEST_CASE("PyNum: Python's int/float arithmetic", "[planner][size]") {
  using device_map::PyNum;
  CHECK(PyNum::Int(3) + PyNum::Float(0.5) == PyNum::Float(3.5));
  CHECK((PyNum::Int(3) + PyNum::Float(0.5)).is_float());
  CHECK(PyNum::Int(9007199254740993) > PyNum::Float(9007199254740992.0));  // exact, unlike double
  CHECK(PyNum::Int(236).FloorDiv(2) == PyNum::Int(118));
  CHECK(PyNum::Int(-7).FloorDiv(2) == PyNum::Int(-4));
  CHECK(PyNum::Float(236.5).FloorDiv(2).Repr() == "118.0");
  CHECK((PyNum::Float(1.25) * PyNum::Int(78)).Trunc() == 97);
  CHECK(PyNum::Float(0.125).Repr() == "0.125");
  CHECK(PyNum::Float(1e16).Repr() == "1e+16");
  CHECK(PyNum::Float(1e15).Repr() == "1000000000000000.0");
  CHECK(PyNum::Float(1e-5).Repr() == "1e-05");
  CHECK(PyNum::Float(0.0001).Repr() == "0.0001");
  CHECK(PyNum::Int(42).Repr() == "42");
  CHECK(device_map::PyMax(PyNum::Int(5), PyNum::Float(5.0)).is_float() == false);
  CHECK(device_map::PyMin(PyNum::Float(5.0), PyNum::Int(5)).is_float() == true);
}

}  // namespace
}  // namespace loadstone
