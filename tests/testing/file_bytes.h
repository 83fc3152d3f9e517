// The bytes of a tensor read straight from its file with std::ifstream: the reference side of a
// comparison with what a load produced (never through loadstone's reader).
#ifndef LOADSTONE_TESTS_TESTING_FILE_BYTES_H_
#define LOADSTONE_TESTS_TESTING_FILE_BYTES_H_

#include <catch2/catch.hpp>
#include <cstddef>
#include <fstream>
#include <vector>

#include "loadstone/checkpoint.h"

namespace loadstone::testing {

inline std::vector<std::byte> FileBytes(const Checkpoint& ckpt, const TensorInfo& t) {
  std::vector<std::byte> out(t.nbytes);
  std::ifstream in(ckpt.files()[t.file].path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t.offset));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  REQUIRE(in.good());
  return out;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_FILE_BYTES_H_
