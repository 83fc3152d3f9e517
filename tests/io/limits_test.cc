// Each bound of io/formats/limits.h met by a hostile file made for it: refused (Unsupported)
// with the bound's name, the file and where, before the allocation the bound is there for; and,
// where such a file is cheap to make, one just inside the bound still read. Large files are
// sparse: they cost no disk, and reading their holes costs no I/O.
#include "io/formats/limits.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/file.h"
#include "io/formats/bnb_state.h"
#include "io/formats/gguf.h"
#include "io/formats/hf_config.h"
#include "io/formats/hf_index.h"
#include "io/formats/offload_folder.h"
#include "io/formats/safetensors.h"
#include "io/formats/torch_pickle.h"
#include "io/formats/zip.h"
#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"
#include "testing/temp_dir.h"

namespace loadstone::io {
namespace {

using testing::TempDir;

void RequireBeyond(const Status& status, std::string_view bound, std::string_view where) {
  INFO(status.ToString());
  REQUIRE(status.code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(status.message()), Catch::Contains(std::string(bound)) &&
                                                Catch::Contains(std::string(where)) &&
                                                Catch::Contains("io/formats/limits.h"));
}

// `bytes` at the start of a file of `size` bytes (the rest a hole).
std::string SparseFile(const TempDir& dir, const std::string& name, const std::string& bytes,
                       uint64_t size) {
  const std::string path = dir.Path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  std::filesystem::resize_file(path, std::max<uint64_t>(size, bytes.size()));
  return path;
}

template <typename T>
std::string Le(T v) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

// A safetensors header of `count` empty U8 tensors, the first named `first` with `rank` dims.
std::string Header(uint64_t count, const std::string& first = "t", size_t rank = 1) {
  std::string shape = "[";
  for (size_t d = 0; d < rank; ++d) shape += d ? ",1" : "0";
  shape += "]";
  std::string json = "{";
  for (uint64_t i = 0; i < count; ++i) {
    json += fmt::format("{}\"{}\":{{\"dtype\":\"U8\",\"shape\":{},\"data_offsets\":[0,0]}}",
                        i ? "," : "", i ? fmt::format("t{}", i) : first, i ? "[0]" : shape);
  }
  return json + "}";
}

Result<SafetensorsHeader> Parse(const std::string& json) {
  return ParseSafetensorsHeader(json, 8 + json.size(), "hostile.safetensors");
}

TEST_CASE("limits: safetensors — tensors per file, name length, rank") {
  RequireBeyond(Parse(Header(kMaxTensorsPerFile + 1)).status(), "kMaxTensorsPerFile",
                "hostile.safetensors");
  CHECK(Parse(Header(1, std::string(kMaxTensorNameBytes, 'n'))).ok());
  RequireBeyond(Parse(Header(1, std::string(kMaxTensorNameBytes + 1, 'n'))).status(),
                "kMaxTensorNameBytes", "hostile.safetensors");
  CHECK(Parse(Header(1, "t", kMaxTensorRank)).ok());
  RequireBeyond(Parse(Header(1, "t", kMaxTensorRank + 1)).status(), "kMaxTensorRank",
                "hostile.safetensors");
}

Result<PickledStateDict> Unpickle(const std::string& body) {
  return ParseTorchPickle("\x80\x02" + body, "hostile/data.pkl");
}

TEST_CASE("limits: pickle — stack, memo, open MARKs, values built") {
  RequireBeyond(Unpickle(std::string(kPickleMaxStack + 1, 'N') + ".").status(), "kPickleMaxStack",
                "hostile/data.pkl");
  // MEMOIZE: one memo entry a byte.
  RequireBeyond(Unpickle("N" + std::string(kPickleMaxMemo + 1, '\x94') + ".").status(),
                "kPickleMaxMemo", "hostile/data.pkl");
  RequireBeyond(Unpickle(std::string(kPickleMaxMarks + 1, '(') + ".").status(), "kPickleMaxMarks",
                "hostile/data.pkl");
  // EMPTY_LIST, APPEND into the list below: a new value every two bytes, the stack two deep.
  std::string lists = "]";
  for (uint64_t i = 0; i < 2'200'000; ++i) lists += "]a";
  RequireBeyond(Unpickle(lists + ".").status(), "PickleMaxValues", "hostile/data.pkl");
}

TEST_CASE("limits: pickle — items copied") {
  // A 1000-character string memoized once, then set as a dict's key again and again: each use
  // hashes its 1000 bytes for 4 bytes of stream (BINGET, NONE, SETITEM).
  std::string body = "}X" + Le<uint32_t>(1000) + std::string(1000, 'k') + "q\x01" + "Ns";
  for (int i = 0; i < 40'000; ++i) body += "h\x01Ns";
  const auto parsed = Unpickle(body + ".");
  RequireBeyond(parsed.status(), "PickleMaxCopies", "hostile/data.pkl");
}

// An end of central directory (ZIP64) claiming `count` entries in `size` bytes from offset 0,
// at the end of a sparse file just large enough to hold them.
std::string Zip64Tail(uint64_t count, uint64_t size) {
  std::string zip64_end = Le<uint32_t>(0x06064b50) + Le<uint64_t>(44) + Le<uint16_t>(45) +
                          Le<uint16_t>(45) + Le<uint32_t>(0) + Le<uint32_t>(0) +
                          Le<uint64_t>(count) + Le<uint64_t>(count) + Le<uint64_t>(size) +
                          Le<uint64_t>(0);
  std::string locator =
      Le<uint32_t>(0x07064b50) + Le<uint32_t>(0) + Le<uint64_t>(size) + Le<uint32_t>(1);
  std::string end = Le<uint32_t>(0x06054b50) + Le<uint16_t>(0) + Le<uint16_t>(0) +
                    Le<uint16_t>(0xFFFF) + Le<uint16_t>(0xFFFF) + Le<uint32_t>(0xFFFFFFFF) +
                    Le<uint32_t>(0xFFFFFFFF) + Le<uint16_t>(0);
  return zip64_end + locator + end;
}

Status ReadZip(const TempDir& dir, uint64_t count, uint64_t size) {
  const std::string path = dir.Path("hostile.bin");
  SparseFile(dir, "hostile.bin", "", size);
  std::ofstream(path, std::ios::binary | std::ios::app) << Zip64Tail(count, size);
  auto file = File::OpenForRead(path);
  REQUIRE(file.ok());
  return ReadZipArchive(*file).status();
}

// A stored zip of one entry `name` of `size` bytes (a hole), as torch.save lays it out.
std::string StoredZip(const TempDir& dir, const std::string& name, uint64_t size) {
  const auto n = static_cast<uint32_t>(size);
  const auto name_len = static_cast<uint16_t>(name.size());
  const std::string local = Le<uint32_t>(0x04034b50) + Le<uint16_t>(20) + Le<uint16_t>(0) +
                            Le<uint16_t>(0) + Le<uint32_t>(0) + Le<uint32_t>(0) + Le<uint32_t>(n) +
                            Le<uint32_t>(n) + Le<uint16_t>(name_len) + Le<uint16_t>(0) + name;
  const std::string central =
      Le<uint32_t>(0x02014b50) + Le<uint16_t>(20) + Le<uint16_t>(20) + Le<uint16_t>(0) +
      Le<uint16_t>(0) + Le<uint32_t>(0) + Le<uint32_t>(0) + Le<uint32_t>(n) + Le<uint32_t>(n) +
      Le<uint16_t>(name_len) + Le<uint16_t>(0) + Le<uint16_t>(0) + Le<uint16_t>(0) +
      Le<uint16_t>(0) + Le<uint32_t>(0) + Le<uint32_t>(0) + name;
  const uint64_t central_at = local.size() + size;
  const std::string end = Le<uint32_t>(0x06054b50) + Le<uint16_t>(0) + Le<uint16_t>(0) +
                          Le<uint16_t>(1) + Le<uint16_t>(1) +
                          Le<uint32_t>(static_cast<uint32_t>(central.size())) +
                          Le<uint32_t>(static_cast<uint32_t>(central_at)) + Le<uint16_t>(0);
  const std::string path = SparseFile(dir, "hostile.bin", local, central_at);
  std::ofstream(path, std::ios::binary | std::ios::app) << central << end;
  return path;
}

TEST_CASE("limits: a .bin's data.pkl") {
  TempDir dir;
  const std::string path = StoredZip(dir, "archive/data.pkl", kTorchMaxPickle + 1);
  RequireBeyond(Checkpoint::Open(path).status(), "kTorchMaxPickle", path);
}

TEST_CASE("limits: zip — central directory size and entries") {
  TempDir dir;
  RequireBeyond(ReadZip(dir, kZipMaxEntries + 1, (kZipMaxEntries + 1) * 46), "kZipMaxEntries",
                dir.Path("hostile.bin"));
  RequireBeyond(ReadZip(dir, 1, kZipMaxCentralDirectory + 1), "kZipMaxCentralDirectory",
                dir.Path("hostile.bin"));
}

// A GGUF v3 header with `n_tensors` tensors and `n_kv` key-values, then `kvs`, in a sparse file
// of `size` bytes.
Status ReadGguf(const TempDir& dir, int64_t n_tensors, int64_t n_kv, const std::string& kvs,
                uint64_t size) {
  const std::string path =
      SparseFile(dir, "hostile.gguf",
                 "GGUF" + Le<uint32_t>(3) + Le<int64_t>(n_tensors) + Le<int64_t>(n_kv) + kvs, size);
  auto file = File::OpenForRead(path);
  REQUIRE(file.ok());
  return ReadGgufHeader(*file).status();
}

std::string Key(const std::string& name) { return Le<uint64_t>(name.size()) + name; }

TEST_CASE("limits: GGUF — tensors, keys, one string, one array, the metadata kept") {
  TempDir dir;
  const std::string path = dir.Path("hostile.gguf");
  RequireBeyond(ReadGguf(dir, kMaxTensorsPerFile + 1, 0, "", 30 << 20), "kMaxTensorsPerFile", path);
  RequireBeyond(ReadGguf(dir, 0, kGgufMaxKeys + 1, "", 1 << 20), "kGgufMaxKeys", path);
  const std::string string_kv = Key("a") + Le<uint32_t>(8) + Le<uint64_t>(kGgufMaxString + 1);
  RequireBeyond(ReadGguf(dir, 0, 1, string_kv, kGgufMaxString + 4096), "kGgufMaxString", path);
  const std::string array_kv =
      Key("a") + Le<uint32_t>(9) + Le<uint32_t>(0) + Le<uint64_t>(kGgufMaxArray + 1);
  RequireBeyond(ReadGguf(dir, 0, 1, array_kv, kGgufMaxArray + 4096), "kGgufMaxArray", path);
  // Strings of 60 MiB (each within kGgufMaxString) until the metadata kept passes its bound;
  // each one's bytes follow it (holes: zeros), so the next key is where the file says.
  const uint64_t each = 60ULL << 20;
  const int keys = static_cast<int>(kGgufMaxMetadataBytes / each) + 1;
  std::string kvs;
  uint64_t at = 4 + 4 + 8 + 8;
  std::string file = "GGUF" + Le<uint32_t>(3) + Le<int64_t>(0) + Le<int64_t>(keys);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file;
    for (int k = 0; k < keys; ++k) {
      const std::string head = Key(fmt::format("k{}", k)) + Le<uint32_t>(8) + Le<uint64_t>(each);
      out.seekp(static_cast<std::streamoff>(at));
      out << head;
      at += head.size() + each;
    }
  }
  std::filesystem::resize_file(path, at);
  auto opened = File::OpenForRead(path);
  REQUIRE(opened.ok());
  RequireBeyond(ReadGgufHeader(*opened).status(), "kGgufMaxMetadataBytes", path);
}

TEST_CASE("limits: the JSON documents read whole") {
  TempDir dir;
  const std::string config = SparseFile(dir, "config.json", "{}", kMaxConfigBytes + 1);
  RequireBeyond(ReadModelConfig(config).status(), "kMaxConfigBytes", config);
  const std::string quantize =
      SparseFile(dir, "quantize_config.json", "{}", kMaxQuantizeConfigBytes + 1);
  ModelConfig model;
  RequireBeyond(ReadQuantizeConfig(quantize, &model), "kMaxQuantizeConfigBytes", quantize);
  const std::string index =
      SparseFile(dir, "model.safetensors.index.json", "{}", kMaxShardIndexBytes + 1);
  RequireBeyond(ReadShardIndex(index).status(), "kMaxShardIndexBytes", index);
  std::filesystem::create_directory(dir.Path("offload"));
  SparseFile(dir, "offload/index.json", "{}", kMaxOffloadIndexBytes + 1);
  RequireBeyond(ReadOffloadIndex(dir.Path("offload")).status(), "kMaxOffloadIndexBytes",
                dir.Path("offload"));
}

TEST_CASE("limits: a bitsandbytes quant state's JSON") {
  TempDir dir;
  const std::vector<std::byte> weight(128), absmax(16), quant_map(64);
  std::vector<std::byte> state(kMaxQuantStateJsonBytes + 1, std::byte{' '});
  state.front() = std::byte{'{'};
  state.back() = std::byte{'}'};
  const std::string w = "layer.weight";
  const std::string path = dir.Path("model.safetensors");
  REQUIRE(WriteSafetensors(
              path, {{w, DType::kU8, {128, 1}, weight, {}},
                     {w + ".absmax", DType::kF32, {4}, absmax, {}},
                     {w + ".quant_map", DType::kF32, {16}, quant_map, {}},
                     {w + ".quant_state.bitsandbytes__nf4", DType::kU8, {state.size()}, state, {}}})
              .ok());
  RequireBeyond(Checkpoint::Open(path).status(), "kMaxQuantStateJsonBytes", path);
}

TEST_CASE("limits: a bitsandbytes nested absmax table") {
  // NF4 of 2^32 + 2^16 elements, blocks of 32, their absmax re-quantized in blocks of 32:
  // 4,194,368 nested absmax floats, 256 bytes beyond the bound. The weight (2 GiB) and its
  // absmax are holes of a sparse file; only the code table and the state's JSON are written.
  TempDir dir;
  const uint64_t elements = (uint64_t{1} << 32) + (uint64_t{1} << 16);
  const std::string state = R"({"quant_type":"nf4","blocksize":32,"dtype":"bfloat16",)"
                            R"("shape":[65536,65537],"nested_blocksize":32,)"
                            R"("nested_dtype":"float32","nested_offset":0.5})";
  const std::string w = "layer.weight";
  const uint64_t absmax_at = 64 + state.size(), weight_at = absmax_at + elements / 32;
  const std::string header = fmt::format(
      R"({{"{0}.quant_map":{{"dtype":"F32","shape":[16],"data_offsets":[0,64]}},)"
      R"("{0}.quant_state.bitsandbytes__nf4":)"
      R"({{"dtype":"U8","shape":[{1}],"data_offsets":[64,{2}]}},)"
      R"("{0}.absmax":{{"dtype":"U8","shape":[{3}],"data_offsets":[{2},{4}]}},)"
      R"("{0}":{{"dtype":"U8","shape":[{5},1],"data_offsets":[{4},{6}]}}}})",
      w, state.size(), absmax_at, elements / 32, weight_at, elements / 2,
      weight_at + elements / 2);
  std::string code(64, '\0');
  std::memcpy(code.data(), Nf4Code().data(), 64);
  const std::string path =
      SparseFile(dir, "model.safetensors", Le<uint64_t>(header.size()) + header + code + state,
                 8 + header.size() + weight_at + elements / 2);
  RequireBeyond(Checkpoint::Open(path).status(), "kMaxNestedAbsmaxBytes", path);
}

}  // namespace
}  // namespace loadstone::io
