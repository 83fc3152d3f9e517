// loadstone against files written and judged by the reference implementation (the `safetensors`
// package, pinned in tests/fixtures/st_reference.py). The fixtures and their *.expected.json
// come from tests/fixtures/make_safetensors_fixtures.py; no Python is needed here.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/safetensors";

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every `*.expected.json` under `folder` (recursively), sorted.
std::vector<fs::path> ExpectedFiles(const fs::path& folder) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 14 && name.ends_with(".expected.json")) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Fixture {
  fs::path expected_path;
  json expected;
  Result<Checkpoint> opened = Status::Cancelled("not opened");
};

// Opens the checkpoint an expected file names, as it names it.
Fixture OpenFixture(const fs::path& expected_path) {
  Fixture f{expected_path, json::parse(ReadAll(expected_path))};
  const json& open = f.expected.at("open");
  OpenOptions options;
  options.variant = open.at("variant").get<std::string>();
  options.subfolder = open.at("subfolder").get<std::string>();
  f.opened = Checkpoint::Open((kFixtures / open.at("path").get<std::string>()).string(), options);
  return f;
}

// The catalog as `loadstone inspect --json` prints it, file paths relative to kFixtures.
json Catalog(const Checkpoint& ckpt) {
  json doc = {{"format", std::string(CheckpointFormatName(ckpt.format()))},
              {"files", json::array()},
              {"tensors", json::array()},
              {"metadata", ckpt.metadata()},
              {"total_bytes", ckpt.total_bytes()}};
  for (const CheckpointFile& file : ckpt.files()) {
    doc["files"].push_back(
        {{"path", fs::path(file.path).lexically_relative(kFixtures).generic_string()},
         {"bytes", file.bytes}});
  }
  for (const TensorInfo& t : ckpt.tensors()) {
    doc["tensors"].push_back({{"name", t.name},
                              {"dtype", std::string(SafetensorsName(t.dtype))},
                              {"shape", t.shape},
                              {"file", t.file},
                              {"offset", t.offset},
                              {"nbytes", t.nbytes}});
  }
  return doc;
}

void CheckCatalog(const Fixture& f) {
  INFO("fixture " << f.expected_path.lexically_relative(kFixtures).string());
  if (!f.opened.ok()) {
    FAIL_CHECK("the reference accepts it, loadstone says " << f.opened.status().ToString());
    return;
  }
  const json actual = Catalog(*f.opened);
  for (const char* key : {"format", "files", "metadata", "total_bytes"}) {
    INFO(key << ": loadstone " << actual[key].dump() << "\n   reference " << f.expected[key].dump());
    CHECK(actual[key] == f.expected.at(key));
  }
  const json& want = f.expected.at("tensors");
  CHECK(actual["tensors"].size() == want.size());
  for (size_t i = 0; i < std::min(actual["tensors"].size(), want.size()); ++i) {
    INFO("tensor #" << i << ": loadstone " << actual["tensors"][i].dump() << "\n   reference "
                    << want[i].dump());
    CHECK(actual["tensors"][i] == want[i]);
  }
}

void CheckError(const Fixture& f) {
  const std::string name = f.expected.at("error").get<std::string>();
  INFO("fixture " << f.expected_path.lexically_relative(kFixtures).string() << " ("
                  << f.expected.value("note", "") << ")\nreference: "
                  << f.expected.at("reference").get<std::string>() << "\nwant: Corruption: "
                  << name << ": ...");
  if (f.opened.ok()) {
    FAIL_CHECK("loadstone accepts it: " << Catalog(*f.opened).dump());
    return;
  }
  INFO("loadstone: " << f.opened.status().ToString());
  CHECK(f.opened.status().code() == StatusCode::kCorruption);
  CHECK(f.opened.status().message().starts_with(name + ": "));
}

bool IsDuplicateKeyCase(const json& expected) {
  return expected.value("error", "") == "DuplicateKey";
}

TEST_CASE("reference fixtures: files the reference wrote open with the catalog it reads") {
  int count = 0;
  for (const fs::path& path : ExpectedFiles(kFixtures)) {
    if (path.parent_path() != kFixtures) continue;  // edge/ has its own test cases
    CheckCatalog(OpenFixture(path));
    ++count;
  }
  CHECK(count >= 10);
}

TEST_CASE("reference fixtures: edge cases get the reference's verdict and error name") {
  int count = 0;
  for (const fs::path& path : ExpectedFiles(kFixtures / "edge")) {
    Fixture f = OpenFixture(path);
    if (IsDuplicateKeyCase(f.expected)) continue;
    if (f.expected.contains("error")) {
      CheckError(f);
    } else {
      CheckCatalog(f);
    }
    ++count;
  }
  CHECK(count >= 40);
}

// A deliberate difference: the reference keeps the last of repeated keys silently (or, for a
// repeated "__metadata__", rejects the header); loadstone refuses every repeated key.
TEST_CASE("reference fixtures: repeated keys, which the reference may accept, are refused") {
  int accepted_by_reference = 0;
  for (const fs::path& path : ExpectedFiles(kFixtures / "edge")) {
    Fixture f = OpenFixture(path);
    if (!IsDuplicateKeyCase(f.expected)) continue;
    accepted_by_reference += f.expected.at("reference") == "accepts";
    CheckError(f);
  }
  CHECK(accepted_by_reference >= 2);
}

// Byte `j` of the `index`-th tensor of a manifest, as make_safetensors_fixtures.py's pattern().
std::vector<std::byte> Pattern(size_t index, DType dtype, uint64_t nbytes) {
  std::vector<std::byte> data(nbytes);
  for (uint64_t j = 0; j < nbytes; ++j) {
    uint64_t b = (index * 37 + j * 11 + 5) % 256;
    if (dtype == DType::kBool) b &= 1;
    data[j] = static_cast<std::byte>(b);
  }
  return data;
}

TEST_CASE("reference fixtures: loadstone's writer reproduces the reference writer byte for byte") {
  testing::TempDir dir;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures / "writer")) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with(".manifest.json")) continue;
    const std::string name = file.substr(0, file.size() - 14);
    INFO("writer/" << name);
    const json manifest = json::parse(ReadAll(entry.path()));
    std::vector<std::vector<std::byte>> data;
    std::vector<TensorToWrite> tensors;
    for (const json& t : manifest.at("tensors")) {
      auto dtype = DTypeFromSafetensorsName(t.at("dtype").get<std::string>());
      REQUIRE(dtype.has_value());
      TensorToWrite w{t.at("name").get<std::string>(), *dtype,
                      t.at("shape").get<std::vector<uint64_t>>(), {}, {}};
      data.push_back(Pattern(tensors.size(), *dtype, w.nbytes()));
      tensors.push_back(std::move(w));
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = data[i];
    std::map<std::string, std::string> metadata;
    if (!manifest.at("metadata").is_null()) metadata = manifest.at("metadata");
    const std::string ours = dir.Path(name + ".safetensors");
    REQUIRE(WriteSafetensors(ours, tensors, metadata).ok());
    const std::string got = ReadAll(ours);
    const std::string want = ReadAll(kFixtures / "writer" / (name + ".safetensors"));
    const size_t diff = std::mismatch(got.begin(), got.end(), want.begin(), want.end()).first -
                        got.begin();
    INFO("first difference at byte " << diff << " of " << got.size() << " (reference "
                                     << want.size() << ")\n  loadstone: " << got.substr(0, 400)
                                     << "\n  reference: " << want.substr(0, 400));
    CHECK(got == want);
    ++count;
  }
  CHECK(count >= 10);
}

}  // namespace
}  // namespace loadstone
