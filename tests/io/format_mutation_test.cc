// Damaged .bin and GGUF files: every truncation and thousands of seeded byte mutations of the
// real producers' fixtures (tests/fixtures/torch, tests/fixtures/gguf) are opened. Each must be
// refused with a Status or read into a catalog whose every tensor lies inside its file — never
// a crash, a hang or an allocation the file's size does not justify (run under ASan/UBSan by
// scripts/sanitize.sh). Mutations inside data.pkl exercise the unpickler with the archive intact.
#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "io/file.h"
#include "io/formats/zip.h"
#include "loadstone/checkpoint.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Opens `bytes` as `name` and checks the verdict: an error, or tensors inside the file.
void OpenChecked(const TempDir& dir, const std::string& name, const std::string& bytes,
                 size_t* opened) {
  const std::string path = dir.Path(name);
  Spit(path, bytes);
  auto ckpt = Checkpoint::Open(path);
  if (!ckpt.ok()) {
    CHECK_FALSE(ckpt.status().message().empty());
    return;
  }
  ++*opened;
  for (const TensorInfo& t : ckpt->tensors()) {
    REQUIRE(t.file < ckpt->files().size());
    CHECK(t.offset <= bytes.size());
    CHECK(t.nbytes <= bytes.size() - std::min<uint64_t>(t.offset, bytes.size()));
  }
}

void Mutate(const std::string& name, const std::string& original, uint64_t lo, uint64_t hi,
            int rounds, uint32_t seed) {
  TempDir dir;
  size_t opened = 0;
  // Every truncation of a small file, evenly spaced ones of a larger one.
  const size_t step = std::max<size_t>(1, original.size() / 2048);
  for (size_t n = 0; n < original.size(); n += step) {
    OpenChecked(dir, name, original.substr(0, n), &opened);
  }
  std::mt19937 rng(seed);
  for (int r = 0; r < rounds; ++r) {
    std::string bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const uint64_t at = lo + rng() % (hi - lo);
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(rng()); break;             // any byte
        case 1: bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8))); break;  // a bit
        default: bytes[at] = static_cast<char>(std::array<uint8_t, 6>{0, 0xff, 0x7f, 0x80, 1, 0x40}[rng() % 6]);
      }
    }
    OpenChecked(dir, name, bytes, &opened);
  }
  WARN(name << ": " << opened << " of the mutants opened (the rest were refused)");
}

TEST_CASE("mutation: damaged torch.save archives are refused or read inside their file") {
  const fs::path torch = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/torch";
  for (const char* name : {"views.bin", "module_state_dict.bin", "float8.bin", "protocol4.bin",
                           "big_endian.bin", "zip64.bin", "nested_state_dict.bin"}) {
    INFO(name);
    const std::string original = Slurp(torch / name);
    REQUIRE(!original.empty());
    Mutate(name, original, 0, original.size(), 1500, 7);
    // The pickle alone, the archive around it intact.
    auto file = io::File::OpenForRead((torch / name).string());
    REQUIRE(file.ok());
    auto zip = io::ReadZipArchive(*file);
    REQUIRE(zip.ok());
    const io::ZipEntry* pkl = nullptr;
    for (const io::ZipEntry& e : zip->entries) {
      if (e.name.ends_with("/data.pkl")) pkl = &e;
    }
    REQUIRE(pkl != nullptr);
    Mutate(name, original, pkl->data_offset, pkl->data_offset + pkl->size, 1500, 11);
  }
}

TEST_CASE("mutation: damaged GGUF files are refused or read inside their file") {
  const fs::path gguf = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/gguf";
  for (const char* name : {"plain.gguf", "quantized.gguf", "aligned64.gguf", "zero_dim.gguf"}) {
    INFO(name);
    const std::string original = Slurp(gguf / name);
    REQUIRE(!original.empty());
    // Mostly the header: that is what the reader parses.
    const uint64_t header = std::min<uint64_t>(original.size(), 2048);
    Mutate(name, original, 0, header, 3000, 13);
  }
}

}  // namespace
}  // namespace loadstone
