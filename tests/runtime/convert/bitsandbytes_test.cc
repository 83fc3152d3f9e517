// bitsandbytes dequantization in pieces: every weight of tests/fixtures/bnb/ (written by
// make_bnb_fixtures.py with bitsandbytes) decoded by DequantBnb4 / DequantBnbInt8 in random
// pieces — odd starts and lengths included, as a piece of a read or a fresh-pages block may be —
// equals, bit for bit, the whole decode's reference (expected*.safetensors). Also: what is refused.
#include "runtime/convert/bitsandbytes.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "testing/file_bytes.h"

namespace loadstone::convert {
namespace {

using loadstone::testing::FileBytes;
const std::string kDir = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/bnb/";

Checkpoint Open(const std::string& path) {
  auto ckpt = Checkpoint::Open(path);
  REQUIRE(ckpt.ok());
  return *ckpt;
}

// Decodes [0, n) in random pieces with `decode(first, count, out)`.
template <typename Decode>
std::vector<std::byte> InPieces(uint64_t n, uint64_t out_elem, std::mt19937_64& rng,
                                const Decode& decode) {
  std::vector<std::byte> out(n * out_elem);
  for (uint64_t first = 0; first < n;) {
    const uint64_t count = std::min<uint64_t>(n - first, 1 + rng() % 97);
    REQUIRE(decode(first, count, out.data() + first * out_elem).ok());
    first += count;
  }
  return out;
}

TEST_CASE("bitsandbytes: 4-bit and int8 weights decode in any pieces as in one", "[convert]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const char* suffix : {"f32", "bf16", "f16"}) {
    const DType to = std::string(suffix) == "f32"    ? DType::kF32
                     : std::string(suffix) == "bf16" ? DType::kBF16
                                                     : DType::kF16;
    const uint64_t out_elem = DTypeBits(to) / 8;
    const Checkpoint bnb4 = Open(kDir + "bnb4.safetensors");
    const Checkpoint expected4 = Open(kDir + "expected.safetensors");
    size_t weights = 0;
    for (const TensorInfo& t : bnb4.tensors()) {
      if (!t.packed) continue;
      INFO(t.name << " into " << suffix);
      ++weights;
      const std::vector<std::byte> packed = FileBytes(bnb4, t);
      const std::vector<std::byte> absmax = FileBytes(bnb4, *bnb4.Find(t.packed->bnb4->absmax));
      const std::vector<std::byte> got = InPieces(
          t.element_count(), out_elem, rng, [&](uint64_t first, uint64_t count, std::byte* out) {
            return DequantBnb4(*t.packed, to, packed.data() + first / 2, first, count,
                               absmax.data(), out);
          });
      const std::vector<std::byte> want =
          FileBytes(expected4, *expected4.Find(t.name + "." + suffix));
      CHECK(got == want);
    }
    CHECK(weights == 9);
    const Checkpoint bnb8 = Open(kDir + "bnb8.safetensors");
    const Checkpoint expected8 = Open(kDir + "expected8.safetensors");
    for (const char* name : {"int8a.weight", "int8b.weight"}) {
      INFO(name << " into " << suffix);
      const TensorInfo& t = *bnb8.Find(name);
      const std::vector<std::byte> codes = FileBytes(bnb8, t);
      const std::vector<std::byte> scb = FileBytes(bnb8, *bnb8.Find(t.packed->bnb8->scb));
      const std::vector<std::byte> got =
          InPieces(t.numel(), out_elem, rng, [&](uint64_t first, uint64_t count, std::byte* out) {
            return DequantBnbInt8(to, codes.data() + first, first, count, t.shape[1], scb.data(),
                                  out);
          });
      CHECK(got == FileBytes(expected8, *expected8.Find(std::string(name) + "." + suffix)));
    }
  }
}

TEST_CASE("bitsandbytes: other targets, other layouts and ranges past the end are refused",
          "[convert]") {
  const Checkpoint bnb4 = Open(kDir + "bnb4.safetensors");
  const TensorInfo& t = *bnb4.Find("nf4.weight");
  std::vector<std::byte> out(t.element_count() * 8), in(t.nbytes), absmax(64);
  CHECK(DequantBnb4(*t.packed, DType::kF64, in.data(), 0, 4, absmax.data(), out.data()).code() ==
        StatusCode::kInvalidArgument);
  CHECK(DequantBnb4(*t.packed, DType::kF32, in.data(), t.element_count() - 2, 3, absmax.data(),
                    out.data())
            .code() == StatusCode::kInvalidArgument);
  PackedLayout gguf;
  gguf.scheme = "Q4_0";
  CHECK(DequantBnb4(gguf, DType::kF32, in.data(), 0, 4, absmax.data(), out.data()).code() ==
        StatusCode::kInvalidArgument);
  CHECK(DequantBnbInt8(DType::kI8, in.data(), 0, 4, 4, absmax.data(), out.data()).code() ==
        StatusCode::kInvalidArgument);
  CHECK(DequantBnbInt8(DType::kF32, in.data(), 0, 4, 0, absmax.data(), out.data()).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loadstone::convert
