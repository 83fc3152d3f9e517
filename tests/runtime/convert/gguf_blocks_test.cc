// GGUF block dequantization against the producer: every tensor of
// tests/fixtures/gguf/dequant/blocks.gguf (written by gguf.GGUFWriter; make_gguf_dequant_fixtures.py)
// decoded by DequantGgufBlocks equals, bit for bit, gguf.quants.dequantize's f32 and torch's
// bf16 / f16 of it (expected.safetensors). Also: the types and targets that are refused.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "runtime/convert/gguf_blocks.h"
#include "testing/file_bytes.h"

namespace loadstone::convert {
namespace {

const std::string kDir = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/dequant/";

using loadstone::testing::FileBytes;

}  // namespace

TEST_CASE("gguf blocks: every type decodes as gguf.quants does, into f32, bf16 and f16, bit for bit",
          "[convert]") {
  auto blocks = Checkpoint::Open(kDir + "blocks.gguf");
  REQUIRE(blocks.ok());
  auto expected = Checkpoint::Open(kDir + "expected.safetensors");
  REQUIRE(expected.ok());
  REQUIRE(blocks->tensors().size() == 20);  // ten types, two shapes each
  for (const TensorInfo& t : blocks->tensors()) {
    INFO(t.name);
    REQUIRE(t.packed.has_value());
    const GgufBlockType* type = FindGgufBlockType(t.packed->scheme);
    REQUIRE(type != nullptr);
    CHECK(type->block_bytes == t.packed->block_bytes);
    CHECK(type->block_elems == t.packed->block_elems);
    const std::vector<std::byte> packed = FileBytes(*blocks, t);
    const uint64_t count = packed.size() / type->block_bytes;
    REQUIRE(count * type->block_bytes == packed.size());
    for (const auto& [suffix, dtype] :
         {std::pair{".f32", DType::kF32}, {".bf16", DType::kBF16}, {".f16", DType::kF16}}) {
      INFO(suffix);
      const TensorInfo* want = expected->Find(t.name + suffix);
      REQUIRE(want != nullptr);
      CHECK(want->shape == t.packed->element_shape);
      const std::vector<std::byte> reference = FileBytes(*expected, *want);
      std::vector<std::byte> out(reference.size(), std::byte{0xEE});
      REQUIRE(CanDequantGguf(t.packed->scheme, dtype));
      REQUIRE(count * type->block_elems * DTypeBits(dtype) / 8 == out.size());
      REQUIRE(DequantGgufBlocks(t.packed->scheme, dtype, packed.data(), out.data(), count).ok());
      size_t differ = 0, first = out.size();
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != reference[i]) {
          ++differ;
          first = std::min(first, i);
        }
      }
      INFO("first differing byte " << first << " of " << out.size());
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("gguf blocks: other types and targets are refused, nothing written", "[convert]") {
  CHECK(FindGgufBlockType("IQ4_XS") == nullptr);
  CHECK_FALSE(CanDequantGguf("IQ4_XS", DType::kF32));
  CHECK_FALSE(CanDequantGguf("Q4_K", DType::kF64));
  CHECK_FALSE(CanDequantGguf("Q4_K", DType::kI8));
  std::vector<std::byte> in(144), out(8, std::byte{0xEE});
  const Status s = DequantGgufBlocks("TQ1_0", DType::kF32, in.data(), out.data(), 1);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("TQ1_0") && Catch::Contains("float32"));
  CHECK(out[0] == std::byte{0xEE});
  const Status f64 = DequantGgufBlocks("Q4_K", DType::kF64, in.data(), out.data(), 1);
  CHECK(f64.code() == StatusCode::kInvalidArgument);
}

}  // namespace loadstone::convert
