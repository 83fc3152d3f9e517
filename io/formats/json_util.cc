#include "io/formats/json_util.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "io/file.h"

namespace loadstone::io {

Result<nlohmann::json> ParseJsonStrict(std::string_view text, std::string_view what) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end: keys.pop_back(); break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  json doc = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    // Parse again with exceptions for the position and reason.
    try {
      json ignored = json::parse(text.begin(), text.end());
      (void)ignored;
    } catch (const json::parse_error& e) {
      return Status::Corruption(fmt::format("{} is not valid JSON: {}", what, e.what()));
    }
    return Status::Corruption(fmt::format("{} is not valid JSON", what));
  }
  if (!duplicate.empty()) {
    return Status::Corruption(
        fmt::format("{}: key '{}' appears twice in one object", what, duplicate));
  }
  return doc;
}

Result<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what,
                                            uint64_t max_bytes) {
  LOADSTONE_ASSIGN_OR_RETURN(File file, File::OpenForRead(path));
  if (file.size() > max_bytes) {
    return Status::Corruption(fmt::format("{} has {} bytes, more than the {} allowed", what,
                                          file.size(), max_bytes));
  }
  std::string text(file.size(), '\0');
  LOADSTONE_RETURN_IF_ERROR(
      file.ReadExact(0, std::as_writable_bytes(std::span<char>(text.data(), text.size()))));
  return ParseJsonStrict(text, what);
}

}  // namespace loadstone::io
