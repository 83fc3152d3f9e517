// ScanJson (io/formats/json_scan.h) held against nlohmann's own sax_parse, the reference: every
// event of both recorded as text, and the contract checked on any text. Used by json_scan_test
// and the json_scan fuzz target.
#ifndef LOADSTONE_TESTS_TESTING_JSON_EVENTS_H_
#define LOADSTONE_TESTS_TESTING_JSON_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/json_scan.h"

namespace loadstone::testing {

// Records each event (values exactly: a double by its bits); the `refuse_at`-th event (1-based)
// returns false. parse_error (nlohmann's only) records that it was called.
class RecordingSax {
 public:
  using json = nlohmann::json;
  explicit RecordingSax(size_t refuse_at = std::numeric_limits<size_t>::max())
      : refuse_at_(refuse_at) {}

  bool null() { return Add("null"); }
  bool boolean(bool b) { return Add(b ? "true" : "false"); }
  bool number_integer(json::number_integer_t v) { return Add(fmt::format("int {}", v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Add(fmt::format("unsigned {}", v)); }
  bool number_float(json::number_float_t v, const std::string& text) {
    return Add(fmt::format("float {:a} '{}'", v, text));
  }
  bool string(std::string& s) { return Add("string '" + s + "'"); }
  bool binary(json::binary_t&) { return Add("binary"); }
  bool key(std::string& k) { return Add("key '" + k + "'"); }
  bool start_object(std::size_t n) { return Add(fmt::format("{{ {}", n)); }
  bool end_object() { return Add("}"); }
  bool start_array(std::size_t n) { return Add(fmt::format("[ {}", n)); }
  bool end_array() { return Add("]"); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    parse_error_called = true;
    return false;
  }

  std::vector<std::string> events;
  bool parse_error_called = false;

 private:
  bool Add(std::string event) {
    events.push_back(std::move(event));
    return events.size() != refuse_at_;
  }

  size_t refuse_at_;
};

// ScanJson's answer for `text` (its handler refusing its `refuse_at`-th event), and the first way
// it breaks the contract against nlohmann on the same text, or "" when it keeps it: kParsed must
// be nlohmann's parse with the same events, kRefused nlohmann stopping at the same event.
struct ScanCheck {
  io::ScanResult result;
  std::string broken;
};

inline ScanCheck CheckScan(std::string_view text,
                           size_t refuse_at = std::numeric_limits<size_t>::max()) {
  RecordingSax fast(refuse_at), reference(refuse_at);
  const io::ScanResult result = io::ScanJson(text, &fast);
  const bool parsed = nlohmann::json::sax_parse(text.begin(), text.end(), &reference,
                                                nlohmann::json::input_format_t::json, true);
  const auto differs = [&](std::string_view what) -> std::string {
    if (fast.events == reference.events) return std::string(what);
    size_t i = 0;
    while (i < fast.events.size() && i < reference.events.size() &&
           fast.events[i] == reference.events[i]) {
      ++i;
    }
    return fmt::format("{}; event {} differs: scan '{}', nlohmann '{}'", what, i + 1,
                       i < fast.events.size() ? fast.events[i] : "(none)",
                       i < reference.events.size() ? reference.events[i] : "(none)");
  };
  switch (result) {
    case io::ScanResult::kParsed:
      if (!parsed || reference.parse_error_called || fast.events != reference.events) {
        return {result, differs(parsed ? "parsed by both" : "parsed, but nlohmann refuses it")};
      }
      break;
    case io::ScanResult::kRefused:
      if (parsed || reference.parse_error_called || fast.events != reference.events) {
        return {result, differs("refused by the handler")};
      }
      break;
    case io::ScanResult::kUnsure: break;
  }
  return {result, ""};
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_JSON_EVENTS_H_
