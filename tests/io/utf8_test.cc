#include "io/formats/utf8.h"

#include <catch2/catch.hpp>

using loadstone::io::FindInvalidUtf8;

TEST_CASE("utf8: valid text, including multi-byte forms") {
  CHECK(FindInvalidUtf8("") == std::string_view::npos);
  CHECK(FindInvalidUtf8("plain ascii, long enough for the fast path") == std::string_view::npos);
  CHECK(FindInvalidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == std::string_view::npos);
}

TEST_CASE("utf8: invalid sequences are found at their first byte") {
  CHECK(FindInvalidUtf8("\xFF") == 0);
  CHECK(FindInvalidUtf8("ab\xC0\xAF") == 2);            // overlong '/'
  CHECK(FindInvalidUtf8("abc\xED\xA0\x80") == 3);       // surrogate
  CHECK(FindInvalidUtf8("\xF4\x90\x80\x80") == 0);      // above U+10FFFF
  CHECK(FindInvalidUtf8("12345678\xE2\x82") == 8);      // truncated at the end
  CHECK(FindInvalidUtf8("\xC3(") == 0);                 // bad continuation
}
