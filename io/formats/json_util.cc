#include "io/formats/json_util.h"

#include <unordered_set>
#include <vector>

#include "io/formats/limits.h"
#include "io/file.h"

namespace loadstone::io {
namespace {

// A first pass over the text that builds nothing: syntax (with the parser's message and byte
// position), the nesting bound and duplicate keys. The DOM parser's own callback hook is not
// used for this: it rescans a parent's members after each child object (quadratic in a large
// array of objects).
class CheckingSax {
 public:
  using json = nlohmann::json;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys_.emplace_back();
    return Deeper();
  }
  bool key(std::string& key) {
    if (!keys_.back().insert(key).second) {
      error_ = fmt::format("key '{}' appears twice in one object", key);
      return false;
    }
    return true;
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) { return Deeper(); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    // Syntax errors and numbers beyond double's range (1e500) alike.
    error_ = fmt::format("is not valid JSON: {}", e.what());
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool Deeper() {
    if (++depth_ <= kMaxJsonDepth) return true;
    error_ = fmt::format(
        "nests arrays and objects more than {} deep (kMaxJsonDepth); no checkpoint document "
        "needs that",
        kMaxJsonDepth);
    return false;
  }

  int depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // one set per open object
  std::string error_;
};

template <typename Json>
Result<Json> Parse(std::string_view text, std::string_view what) {
  try {
    CheckingSax check;
    if (!nlohmann::json::sax_parse(text.begin(), text.end(), &check)) {
      const bool own_phrase = check.error().rfind("is not", 0) == 0 || check.error().rfind("nests", 0) == 0;
      return Status::Corruption(fmt::format("{}{}{}", what, own_phrase ? " " : ": ", check.error()));
    }
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // not expected after the check; never escapes
    return Status::Corruption(fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

template <typename Json>
std::string Describe(const Json& value) {
  if (value.is_string()) {
    const auto& s = value.template get_ref<const std::string&>();
    return s.size() <= 64 ? fmt::format("the string \"{}\"", s)
                          : fmt::format("a string of {} bytes", s.size());
  }
  if (value.is_object()) return fmt::format("an object of {} keys", value.size());
  if (value.is_array()) return fmt::format("an array of {} values", value.size());
  return fmt::format("{} {}", value.type_name(), value.dump());  // a scalar: short
}

}  // namespace

Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view what) {
  return Parse<nlohmann::json>(text, what);
}

Result<nlohmann::ordered_json> ParseJsonStrictOrdered(std::string_view text,
                                                      std::string_view what) {
  return Parse<nlohmann::ordered_json>(text, what);
}

std::string DescribeJsonValue(const nlohmann::json& value) { return Describe(value); }
std::string DescribeJsonValue(const nlohmann::ordered_json& value) { return Describe(value); }

Result<std::string> ReadSmallFile(const std::string& path, std::string_view what,
                                  uint64_t max_bytes, std::string_view bound) {
  LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  if (file.size() > max_bytes) {
    return BeyondBound(what, fmt::format("a file of {} bytes", file.size()), bound, max_bytes);
  }
  std::string text(file.size(), '\0');
  LOADSTONE_RETURN_IF_ERROR(
      file.ReadExact(0, std::as_writable_bytes(std::span<char>(text.data(), text.size()))));
  return text;
}

Result<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what,
                                    uint64_t max_bytes, std::string_view bound) {
  LOADSTONE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, what, max_bytes, bound));
  return ParseJsonStrict(text, what);
}

}  // namespace loadstone::io
