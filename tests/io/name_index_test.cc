// NameIndex (io/name_index.h): every name found at its position, absent names not, the first
// repeat reported, at table sizes from empty to a hundred thousand names.
#include "io/name_index.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

namespace loadstone {
namespace {

using io::NameIndex;

TEST_CASE("name index: finds each name at its position, and nothing else") {
  for (size_t n : {0, 1, 2, 3, 7, 100, 100'000}) {
    INFO(n << " names");
    std::vector<std::string> names;
    for (size_t i = 0; i < n; ++i) names.push_back(fmt::format("model.layers.{}.mlp.weight", i));
    const auto name_of = [&](size_t i) -> std::string_view { return names[i]; };
    NameIndex index;
    CHECK(index.Build(n, name_of) == NameIndex::kNone);
    for (size_t i = 0; i < n; ++i) REQUIRE(index.Find(names[i], name_of) == i);
    CHECK_FALSE(index.Find("model.layers.0.mlp", name_of).has_value());
    CHECK_FALSE(index.Find("", name_of).has_value());
    CHECK_FALSE(index.Find(fmt::format("model.layers.{}.mlp.weight", n), name_of).has_value());
  }
  NameIndex unbuilt;
  CHECK_FALSE(unbuilt.Find("a", [](size_t) { return std::string_view(); }).has_value());
}

TEST_CASE("name index: a repeated name is reported at its first repeat, the first kept") {
  const std::vector<std::string> names = {"a", "b", "", "c", "b", "", "a"};
  const auto name_of = [&](size_t i) -> std::string_view { return names[i]; };
  NameIndex index;
  CHECK(index.Build(names.size(), name_of) == 4);
  CHECK(index.Find("b", name_of) == 1);
  CHECK(index.Find("", name_of) == 2);
  CHECK(index.Find("a", name_of) == 0);
  CHECK(index.Find("c", name_of) == 3);
}

}  // namespace
}  // namespace loadstone
