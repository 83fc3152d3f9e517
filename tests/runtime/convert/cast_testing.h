// Helpers for the convert tests: run CastBuffer over a vector.
#ifndef LOADSTONE_TESTS_RUNTIME_CONVERT_CAST_TESTING_H_
#define LOADSTONE_TESTS_RUNTIME_CONVERT_CAST_TESTING_H_

#include <catch2/catch.hpp>
#include <cstddef>
#include <vector>

#include "loadstone/dtype.h"
#include "reference.h"
#include "runtime/convert/cast.h"

namespace loadstone::convert::testing {

// CastBuffer over `in` (elements of `from`, held as In) into a vector of Out (the width of
// `to`); REQUIREs success.
template <typename Out, typename In>
std::vector<Out> Cast(DType from, DType to, const std::vector<In>& in) {
  REQUIRE(ElementBytes(from, 1) == sizeof(In));
  REQUIRE(ElementBytes(to, 1) == sizeof(Out));
  std::vector<Out> out(in.size());
  const Status s = CastBuffer(from, to, reinterpret_cast<const std::byte*>(in.data()),
                              reinterpret_cast<std::byte*>(out.data()), in.size());
  REQUIRE(s.ok());
  return out;
}

}  // namespace loadstone::convert::testing

#endif  // LOADSTONE_TESTS_RUNTIME_CONVERT_CAST_TESTING_H_
