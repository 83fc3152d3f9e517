// ScanJson (io/formats/json_scan.h) against nlohmann's sax_parse, the reference, on the same
// texts: what it parses it parses into the same events, where a handler refuses it stops where
// nlohmann stops, and what it leaves to nlohmann is only what it says it leaves. Ordinary
// documents must take the fast path (a scanner that declined everything would pass the rest).
#include "io/formats/json_scan.h"

#include <cstdio>
#include <random>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/testing/json_events.h"

namespace loadstone {
namespace {

using io::ScanResult;
using testing::CheckScan;

ScanResult Checked(const std::string& text) {
  const testing::ScanCheck check = CheckScan(text);
  INFO(text.substr(0, 200));
  CHECK(check.broken == "");
  return check.result;
}

TEST_CASE("json scan: what it reads, it reads as nlohmann does") {
  for (const char* text : {
           "{}", "[]", "0", "-0", "\"\"", "true", "false", "null", " \t\r\n{ } \n",
           R"({"a": 1, "b": [1, 2, {"c": null}], "d": {"e": true, "f": false}})",
           "18446744073709551615", "-9223372036854775808", "9223372036854775808", "-1",
           "1.5", "-0.0", "1e3", "1E+3", "2.5e-3", "123456789012345678901234.5",
           R"(["\"\\\/\b\f\n\r\t"])", R"(["\u00e9\u4e2d\ud83d\ude00", "Ω ünïcode ⚙"])",
           R"({"model.layers.0.weight": {"dtype": "BF16", "shape": [4, 8],
               "data_offsets": [0, 64]}, "__metadata__": {"format": "pt"}})",
           "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
       }) {
    CHECK(Checked(text) == ScanResult::kParsed);
  }
  // A subnormal double: either reader's, as long as what ScanJson reads is right.
  Checked("1e-320");
  Checked("[4.9e-324, 2.2250738585072011e-308]");
}

TEST_CASE("json scan: what it does not vouch for, it leaves to nlohmann") {
  for (const std::string& text : {
           std::string(""), std::string("   "), std::string("{"), std::string("[1,]"),
           std::string("{\"a\" 1}"), std::string("{\"a\":1,}"), std::string("01"),
           std::string("1."), std::string("-"), std::string("1e"), std::string("1e+"),
           std::string("+1"), std::string(".5"), std::string("tru"), std::string("nul"),
           std::string("[1] x"), std::string("{} {}"), std::string("18446744073709551616"),
           std::string("-9223372036854775809"), std::string("1e500"), std::string("-1e400"),
           std::string("\"\\ud800\""), std::string("\"\\udc00\""), std::string("\"\\u0000\""),
           std::string("\"\\ud800\\u0041\""), std::string("\"\\x\""), std::string("\"\\u12g4\""),
           std::string("\"a\tb\""), std::string("\"\xC0\xAF\""), std::string("\"\xED\xA0\x80\""),
           std::string("\"\xF4\x90\x80\x80\""), std::string("\"\xE2\x82\""),
           std::string("\xEF\xBB\xBF{}"), std::string("{}\0 junk", 8), std::string("[1\0]", 4),
           std::string("\"abc"), std::string("[\"a\" \"b\"]"), std::string("{1: 2}"),
           std::string("/* c */ {}"), std::string("NaN"), std::string("[Infinity]"),
       }) {
    // Anything ScanJson answers here must still be right; what these are is nlohmann's to say.
    CHECK(Checked(text) == ScanResult::kUnsure);
  }
}

TEST_CASE("json scan: a handler that refuses stops both readers at the same event") {
  const std::string text =
      R"({"a": [1, -2, 3.5, "x", true, null], "b": {"c": {}, "d": []}, "e": "\u00e9"})";
  testing::RecordingSax all;
  REQUIRE(io::ScanJson(text, &all) == ScanResult::kParsed);
  REQUIRE(all.events.size() == 22);
  for (size_t k = 1; k <= all.events.size(); ++k) {
    INFO("refusing event " << k);
    const testing::ScanCheck check = CheckScan(text, k);
    CHECK(check.result == ScanResult::kRefused);
    CHECK(check.broken == "");
  }
}

TEST_CASE("json scan: deep nesting costs no stack") {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  testing::RecordingSax sax;
  CHECK(io::ScanJson(deep, &sax) == ScanResult::kParsed);
  CHECK(sax.events.size() == 2'000'000);
}

// A random value of every kind, with keys and strings that need escapes now and then.
nlohmann::json RandomValue(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 4 ? 5 : 7);
  const auto text = [&] {
    static const std::string kChars = "abz09._-/ \"\\\n\t\x7f\xc3\xa9";
    std::string s;
    for (int n = static_cast<int>(rng() % 12); n > 0; --n) {
      const char c = kChars[rng() % kChars.size()];
      if (static_cast<unsigned char>(c) == 0xc3) {
        s += "\xc3\xa9";  // é, whole
      } else if (static_cast<unsigned char>(c) != 0xa9) {
        s += c;
      }
    }
    return s;
  };
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<uint64_t>(rng() >> (rng() % 64));
    case 3: return -static_cast<int64_t>(rng() >> (1 + rng() % 63));
    case 4: return std::ldexp(static_cast<double>(rng() % 1000003) - 500000, int(rng() % 80) - 40);
    case 5: return text();
    case 6: {
      nlohmann::json a = nlohmann::json::array();
      for (int n = static_cast<int>(rng() % 5); n > 0; --n) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int n = static_cast<int>(rng() % 5); n > 0; --n) o[text()] = RandomValue(rng, depth + 1);
      return o;
    }
  }
}

TEST_CASE("json scan: random documents, whole and mutated, agree with nlohmann") {
  const uint64_t seed = std::random_device{}();
  std::printf("json scan: seed %llu\n", static_cast<unsigned long long>(seed));
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  size_t parsed = 0, unsure = 0;
  for (int round = 0; round < 3000; ++round) {
    const nlohmann::json value = RandomValue(rng, 0);
    // nlohmann writes valid JSON: \u escapes for control characters, UTF-8 as it is (ASCII
    // only with ensure_ascii: \u escapes then, surrogate pairs included).
    const std::string text = value.dump(round % 3 == 0 ? 2 : -1, ' ', round % 2 == 0);
    if (Checked(text) == ScanResult::kParsed) ++parsed;
    // The same bytes, one of them changed, cut short, or doubled.
    std::string mutated = text;
    const size_t at = mutated.empty() ? 0 : rng() % mutated.size();
    switch (rng() % 3) {
      case 0:
        if (!mutated.empty()) mutated[at] = static_cast<char>(rng());
        break;
      case 1: mutated.resize(at); break;
      default: mutated.insert(at, mutated.substr(at, 1 + rng() % 4));
    }
    if (Checked(mutated) == ScanResult::kUnsure) ++unsure;
  }
  // Every valid document takes the fast path (none holds a NUL or a subnormal).
  CHECK(parsed == 3000);
  CHECK(unsure > 0);
}

}  // namespace
}  // namespace loadstone
