// The flags every planning command shares, as a user types them: values that never swallow the
// path, accelerate's spellings, errors that name the flag and the item, and nothing silent.
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <set>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/version.h"
#include "loadstone/writer.h"
#include "tests/tools/cli_runner.h"

namespace loadstone {
namespace {

using testing::RunCli;
using testing::TempDir;

bool OneErrorLine(const testing::CliRun& run) {
  return run.code == 1 && run.err.starts_with("error: ") &&
         std::count(run.err.begin(), run.err.end(), '\n') == 1;
}

// A small Llama-shaped bf16 checkpoint with norms, a head and a float8 weight with scales.
struct Model {
  TempDir dir;
  std::string path;
  Model() {
    static const std::vector<std::byte> big(64 * 64 * 2), norm(64 * 2), f8(256 * 256), scales(16);
    std::vector<TensorToWrite> t = {
        {"model.embed_tokens.weight", DType::kBF16, {64, 64}, big, {}},
        {"model.layers.0.mlp.up_proj.weight", DType::kBF16, {64, 64}, big, {}},
        {"model.layers.0.input_layernorm.weight", DType::kBF16, {64}, norm, {}},
        {"model.layers.1.mlp.up_proj.weight", DType::kBF16, {64, 64}, big, {}},
        {"model.layers.1.input_layernorm.weight", DType::kBF16, {64}, norm, {}},
        {"model.norm.weight", DType::kBF16, {64}, norm, {}},
        {"lm_head.weight", DType::kBF16, {64, 64}, big, {}},
        {"model.layers.1.mlp.fp8.weight", DType::kF8E4M3, {256, 256}, f8, {}},
        {"model.layers.1.mlp.fp8.weight_scale_inv", DType::kF32, {2, 2}, scales, {}},
    };
    path = dir.Path("model");
    REQUIRE(WriteShardedSafetensors(path, t, {.max_shard_size = 40'000}).ok());
  }
};

// name → dtype from `load --json`.
std::map<std::string, std::string> DTypes(const std::string& json_text) {
  std::map<std::string, std::string> out;
  const nlohmann::json doc = nlohmann::json::parse(json_text);
  for (const auto& t : doc["tensors"]) out[t["name"].get<std::string>()] = t["dtype"].get<std::string>();
  return out;
}

TEST_CASE("cli: --version and parse errors in loadstone's own form", "[tools][cli]") {
  const auto version = RunCli("--version");
  CHECK(version.code == 0);
  CHECK(version.out == std::string("loadstone ") + LOADSTONE_VERSION_STRING + "\n");
  const auto missing = RunCli("load");
  CHECK(OneErrorLine(missing));
  CHECK(missing.err == "error: InvalidArgument: path is required; see 'loadstone load --help'\n");
  const auto bogus = RunCli("plan --bogus");
  CHECK(OneErrorLine(bogus));
  CHECK(bogus.err.find("--bogus") != std::string::npos);
  const auto help = RunCli("load --help");
  CHECK(help.code == 0);
  CHECK(help.out.find("f32 (float32, fp32, float), f16 (float16, fp16, half) or bf16") != std::string::npos);
  CHECK(help.out.find("uring (io_uring)") != std::string::npos);
}

TEST_CASE("cli: repeatable options take one value each and split commas", "[tools][cli]") {
  Model m;
  const auto swallow = RunCli("load --keep-fp32 norm " + m.path + " --dtype f16 --json");
  INFO(swallow.err);
  REQUIRE(swallow.code == 0);
  auto dtypes = DTypes(swallow.out);
  CHECK(dtypes["model.norm.weight"] == "F32");
  CHECK(dtypes["model.layers.0.input_layernorm.weight"] == "F16");  // 'norm' is a whole component
  CHECK(dtypes["lm_head.weight"] == "F16");
  const auto commas = RunCli("load " + m.path + " --dtype bf16 --keep-fp32 norm,lm_head --json");
  REQUIRE(commas.code == 0);
  dtypes = DTypes(commas.out);
  CHECK(dtypes["model.norm.weight"] == "F32");
  CHECK(dtypes["lm_head.weight"] == "F32");
  CHECK(dtypes["model.layers.1.mlp.fp8.weight"] == "BF16");
  const auto block = RunCli("load --fp8-block 128,128 " + m.path + " --dtype bf16 --json");
  CHECK(block.code == 0);
  const auto bad_block = RunCli("load " + m.path + " --fp8-block 128");
  CHECK(OneErrorLine(bad_block));
  CHECK(bad_block.err.find("--fp8-block 128: give ROWS,COLS") != std::string::npos);
}

TEST_CASE("cli: dtype spellings, and errors that list them", "[tools][cli]") {
  Model m;
  for (const char* ok : {"f16", "fp16", "float16", "half", "torch.float16", "F16"}) {
    INFO(ok);
    CHECK(RunCli("plan " + m.path + " --device-map cpu --dtype " + ok).code == 0);
  }
  const auto unknown = RunCli("load " + m.path + " --dtype f12");
  CHECK(OneErrorLine(unknown));
  CHECK(unknown.err.find("--dtype f12: unknown dtype; --dtype takes f32 (float32, fp32, float)") !=
        std::string::npos);
  for (const char* not_target : {"f64", "fp8", "f8_e4m3fn", "F8_E5M2", "float8_e4m3fn", "int8"}) {
    INFO(not_target);
    const auto load = RunCli("load " + m.path + " --dtype " + not_target);
    const auto plan = RunCli("plan " + m.path + " --dtype " + not_target);
    CHECK(OneErrorLine(load));
    CHECK(load.err.find("loadstone does not cast to") != std::string::npos);
    CHECK(load.err == plan.err);  // plan and load agree on what a dtype is
  }
  const auto special = RunCli("load " + m.path + " --special-dtype lm_head.weight=fp32 --json");
  REQUIRE(special.code == 0);
  CHECK(DTypes(special.out)["lm_head.weight"] == "F32");
  const auto no_eq = RunCli("load " + m.path + " --special-dtype lm_head.weight");
  CHECK(OneErrorLine(no_eq));
  CHECK(no_eq.err.find("is not NAME=DTYPE") != std::string::npos);
}

TEST_CASE("cli: budgets: spaces, devices twice, bits, and errors naming the item", "[tools][cli]") {
  Model m;
  CHECK(RunCli("plan " + m.path + " --device-map sequential --max-memory '0=400KiB, cpu=1GiB'").code == 0);
  const auto twice = RunCli("plan " + m.path + " --max-memory cpu=10GB,cpu=1GB");
  CHECK(OneErrorLine(twice));
  CHECK(twice.err.find("--max-memory gives cpu twice ('cpu=10GB' and 'cpu=1GB')") != std::string::npos);
  const auto alias = RunCli("plan " + m.path + " --max-memory 0=1GB,cuda:0=2GB");
  CHECK(alias.err.find("gives cuda:0 twice") != std::string::npos);
  const auto bits = RunCli("plan " + m.path + " --max-memory cpu=10gb");
  CHECK(bits.code == 0);
  CHECK(bits.err.find("warning: --max-memory cpu=10gb: a lowercase 'b' means bits, as in accelerate "
                      "(10gb = 1250000000 bytes); write 10GB for bytes") != std::string::npos);
  const auto bad = RunCli("plan " + m.path + " --max-memory 0=5XB");
  CHECK(OneErrorLine(bad));
  CHECK(bad.err.find("--max-memory 0=5XB: `size` 5XB is not in a valid format") != std::string::npos);
  const auto device = RunCli("plan " + m.path + " --max-memory gpu0=1GB");
  CHECK(device.err.find("'gpu0' in 'gpu0=1GB' is not a device") != std::string::npos);
  const auto staging = RunCli("load " + m.path + " --staging 64XB");
  CHECK(staging.err.find("--staging 64XB: ") != std::string::npos);
}

TEST_CASE("cli: options that change nothing are warned about, never silent", "[tools][cli]") {
  Model m;
  const auto keep = RunCli("load " + m.path + " --keep-fp32 norm");
  CHECK(keep.code == 0);
  CHECK(keep.err.find("warning: keep_in_fp32 has no effect without a target dtype") != std::string::npos);
  const auto special = RunCli("load " + m.path + " --special-dtype nonexist=bf16");
  CHECK(special.code == 0);
  CHECK(special.err.find("warning: special dtype for 'nonexist' names no tensor") != std::string::npos);
  const auto cls = RunCli("plan " + m.path + " --device-map auto --max-memory 0=20KiB,cpu=1GiB "
                          "--no-split LlamaDecoderLayer");
  CHECK(OneErrorLine(cls));
  CHECK(cls.err.find("no-split entry 'LlamaDecoderLayer' matches no module") != std::string::npos);
  const auto glob = RunCli("plan " + m.path + " --device-map auto --max-memory 0=20KiB,cpu=1GiB "
                           "--no-split 'foo.*'");
  CHECK(glob.code == 0);
  CHECK(glob.err.find("warning: no-split entry 'foo.*' matches no module") != std::string::npos);
  const auto backend = RunCli("load " + m.path + " --backend io_uring");
  CHECK(backend.code == 0);
  CHECK(backend.out.find("backend: io_uring") != std::string::npos);
}

TEST_CASE("cli: load takes what plan takes: a description, a strategy, an explicit map", "[tools][cli]") {
  Model m;
  TempDir dir;
  const auto plan = RunCli("plan " + m.path + " --device-map cpu --json", dir.Path("plan.json"));
  REQUIRE(plan.code == 0);
  const auto from_file = RunCli("load " + m.path + " --device-map " + dir.Path("plan.json") + " --json");
  INFO(from_file.err);
  REQUIRE(from_file.code == 0);
  const nlohmann::json loaded = nlohmann::json::parse(from_file.out);
  for (const auto& t : loaded["tensors"]) CHECK(t["device"] == "cpu");
  const auto inline_map = RunCli("load " + m.path + R"( --device-map '{"model": "cpu", "lm_head": "cpu"}')");
  CHECK(inline_map.code == 0);
  const auto partial = RunCli("load " + m.path + R"( --device-map '{"model": "cpu"}')");
  CHECK(OneErrorLine(partial));
  CHECK(partial.err.find("gives no device for tensor 'lm_head.weight'") != std::string::npos);
  const auto missing = RunCli("load " + m.path + " --device-map /nonexistent/map.json");
  CHECK(OneErrorLine(missing));
  CHECK(RunCli("load " + m.path + " --strategy min-max --device-map sequential").code == 0);
  const std::string description = dir.Write("model.json", R"({"modules": {"class": "M", "children": [
      {"name": "model", "class": "Model", "children": [
        {"name": "embed_tokens", "class": "Embedding", "params": [{"name": "weight", "shape": [64, 64], "dtype": "bfloat16"}]},
        {"name": "layers", "class": "ModuleList", "children": [
          {"name": "0", "class": "Layer", "children": [
            {"name": "mlp", "class": "MLP", "children": [{"name": "up_proj", "class": "Linear", "params": [{"name": "weight", "shape": [64, 64], "dtype": "bfloat16"}]}]},
            {"name": "input_layernorm", "class": "Norm", "params": [{"name": "weight", "shape": [64], "dtype": "bfloat16"}]}]},
          {"name": "1", "class": "Layer", "children": [
            {"name": "mlp", "class": "MLP", "children": [
              {"name": "up_proj", "class": "Linear", "params": [{"name": "weight", "shape": [64, 64], "dtype": "bfloat16"}]},
              {"name": "fp8", "class": "Linear", "params": [{"name": "weight", "shape": [256, 256], "dtype": "float8_e4m3fn"},
                                                          {"name": "weight_scale_inv", "shape": [2, 2], "dtype": "float32"}]}]},
            {"name": "input_layernorm", "class": "Norm", "params": [{"name": "weight", "shape": [64], "dtype": "bfloat16"}]}]}]},
        {"name": "norm", "class": "Norm", "params": [{"name": "weight", "shape": [64], "dtype": "bfloat16"}]}]},
      {"name": "lm_head", "class": "Linear", "params": [{"name": "weight", "shape": [64, 64], "dtype": "bfloat16"}]}]},
      "no_split": ["Layer"], "mode": "cpu"})");
  const auto described = RunCli("load " + m.path + " --model-json " + description + " --json");
  INFO(described.err);
  CHECK(described.code == 0);
  const auto described_plan = RunCli("plan " + m.path + " --model-json " + description + " --json");
  CHECK(described_plan.code == 0);
  CHECK(nlohmann::json::parse(described_plan.out)["no_split"] == nlohmann::json::array({"Layer"}));
}

// Eight equal layers between an embedding and a head: a model that balances over two GPUs.
struct LayeredModel {
  TempDir dir;
  std::string path;
  LayeredModel() {
    static std::vector<std::vector<std::byte>> data;
    data.clear();
    for (int i = 0; i < 10; ++i) data.emplace_back(256 * 256 * 2, std::byte(i + 1));
    std::vector<TensorToWrite> t = {{"model.embed_tokens.weight", DType::kBF16, {256, 256}, data[0], {}}};
    for (int i = 0; i < 8; ++i) {
      t.push_back({"model.layers." + std::to_string(i) + ".w", DType::kBF16, {256, 256}, data[i + 1], {}});
    }
    t.push_back({"lm_head.weight", DType::kBF16, {256, 256}, data[9], {}});
    path = dir.Path("model");
    REQUIRE(WriteShardedSafetensors(path, t, {.max_shard_size = 600'000}).ok());
  }
};

TEST_CASE("cli: --assume-gpus plans for a machine that is not this one, and loads onto it simulated",
          "[tools][cli]") {
  LayeredModel m;
  const auto plan = RunCli("plan " + m.path + " --device-map auto --assume-gpus 2x600MiB --json");
  INFO(plan.err);
  REQUIRE(plan.code == 0);
  const nlohmann::json doc = nlohmann::json::parse(plan.out);
  std::set<nlohmann::json> values;
  for (const auto& [prefix, device] : doc["device_map"].items()) values.insert(device);
  CHECK(values.count(0) == 1);
  CHECK(values.count(1) == 1);
  CHECK(doc["budgets"].contains("1"));
  const auto load = RunCli("load " + m.path + " --device-map auto --assume-gpus 2x600MiB --json");
  const auto cpu = RunCli("load " + m.path + " --json");
  REQUIRE(load.code == 0);
  REQUIRE(cpu.code == 0);
  const nlohmann::json on_gpus = nlohmann::json::parse(load.out), on_cpu = nlohmann::json::parse(cpu.out);
  CHECK(on_gpus["simulated"] == true);
  CHECK(on_gpus["platform"] == "simulated: 2 GPU(s) of 600 MiB, 600 MiB");
  CHECK(on_gpus["devices"].contains("cuda:0"));
  CHECK(on_gpus["devices"].contains("cuda:1"));
  std::map<std::string, uint32_t> crc;
  for (const auto& t : on_cpu["tensors"]) crc[t["name"].get<std::string>()] = t["crc32"].get<uint32_t>();
  REQUIRE(crc.size() == on_gpus["tensors"].size());
  for (const auto& t : on_gpus["tensors"]) {
    INFO(t.dump());
    CHECK(t["device"].get<std::string>().starts_with("cuda:"));
    CHECK(crc[t["name"].get<std::string>()] == t["crc32"].get<uint32_t>());  // the same bytes
  }
  const auto human = RunCli("load " + m.path + " --device-map auto --assume-gpus 2x600MiB");
  CHECK(human.out.find("devices: simulated: 2 GPU(s) of 600 MiB, 600 MiB") != std::string::npos);
  const auto bad = RunCli("plan " + m.path + " --assume-gpus 2x");
  CHECK(OneErrorLine(bad));
  CHECK(RunCli("plan " + m.path + " --assume-gpus two").err.find("give COUNTxSIZE") != std::string::npos);
}

TEST_CASE("cli: --pin-memory plans pinned CPU tensors, pins on a GPU, refuses without one",
          "[tools][cli]") {
  TempDir dir;
  static const std::vector<std::byte> bytes(1 << 20);
  const std::string path = dir.Path("model.safetensors");
  REQUIRE(WriteSafetensors(path, {{"w", DType::kF16, {512, 1024}, bytes, {}}}).ok());
  const auto plan = RunCli("plan " + path + " --device-map cpu --json --pin-memory");
  INFO(plan.err);
  REQUIRE(plan.code == 0);
  CHECK(nlohmann::json::parse(plan.out).at("pinned_bytes") == bytes.size());
  CHECK(nlohmann::json::parse(RunCli("plan " + path + " --device-map cpu --json").out)
            .at("pinned_bytes") == 0);
  CHECK(RunCli("plan " + path + " --device-map cpu --pin-memory").out.find("pinned: 1 CPU tensors") !=
        std::string::npos);
  // A simulated GPU: loaded, and the backend says the memory is ordinary.
  const auto sim = RunCli("load " + path + " --pin-memory --assume-gpus 1x1GiB --json");
  INFO(sim.err);
  REQUIRE(sim.code == 0);
  CHECK(nlohmann::json::parse(sim.out).at("backend").get<std::string>().find(
            "cuda:0 is simulated, they are ordinary host memory") != std::string::npos);
  // This machine's own GPUs: none in CI, so the load is refused, in one line.
  const auto here = RunCli("load " + path + " --pin-memory");
  if (here.code != 0) {
    CHECK(here.err.find("no GPU to pin it for") != std::string::npos);
    CHECK(OneErrorLine(here));
  }
}

TEST_CASE("cli: plan shows each read's route, the route flags change it, load reports the routes taken",
          "[tools][cli]") {
  TempDir dir;
  static const std::vector<std::byte> large(1024 * 1024 * 2), small(64 * 2);
  const std::string path = dir.Path("model.safetensors");
  REQUIRE(WriteSafetensors(path, {{"big.weight", DType::kBF16, {1024, 1024}, large, {}},
                                  {"big.bias", DType::kBF16, {64}, small, {}}})
              .ok());
  auto routes = [&](const std::string& flags) {
    const auto run = RunCli("plan " + path + " --device-map cpu --json " + flags);
    INFO(run.err);
    REQUIRE(run.code == 0);
    return nlohmann::json::parse(run.out)["routes"];
  };
  // The 2 MiB weight in fresh pages; the 128-byte bias in a buffer of its own read, too small
  // for fresh pages, so staged when cold.
  const nlohmann::json fresh = routes("");
  CHECK(fresh.at("fresh pages").at("reads") == 1);
  CHECK(fresh.at("fresh pages").at("bytes") == large.size());
  CHECK(fresh.at("staged when cold").at("bytes") == small.size());
  CHECK(routes("--no-fresh-pages").at("staged when cold").at("bytes") == large.size() + small.size());
  CHECK(routes("--no-fresh-pages --no-stage-cold").at("in place").at("bytes") ==
        large.size() + small.size());
  const nlohmann::json cast = routes("--dtype f32");
  CHECK(cast.at("staged").at("bytes") == large.size() + small.size());
  CHECK(cast.size() == 1);
  const auto human = RunCli("plan " + path + " --device-map cpu --no-fresh-pages");
  CHECK(human.out.find("staged when cold") != std::string::npos);

  // load: every byte of the plan on a route taken; none left "when cold" or "fresh pages".
  for (const std::string flags : {"", "--no-fresh-pages", "--mmap"}) {
    INFO(flags);
    const auto load = RunCli("load " + path + " --json " + flags);
    REQUIRE(load.code == 0);
    const nlohmann::json doc = nlohmann::json::parse(load.out);
    uint64_t bytes = 0;
    for (const auto& [route, count] : doc["routes"].items()) {
      CHECK((route == "in place" || route == "staged" || route == "page-cache copy" ||
             route == "mapped"));
      bytes += count["bytes"].get<uint64_t>();
    }
    CHECK(bytes == large.size() + small.size());
    if (flags == "--mmap") CHECK(doc["routes"]["mapped"]["bytes"] == bytes);
  }
}

TEST_CASE("cli: a full disk, an unwritable trace, a FIFO are errors, not exit 0 or a hang",
          "[tools][cli]") {
  Model m;
  TempDir dir;
  for (const std::string& args : {"load " + m.path + " --json", "inspect " + m.path + " --json",
                                 "plan " + m.path + " --json", std::string("--help"),
                                 std::string("--version"), std::string("load --help"),
                                 std::string("convert --help")}) {
    INFO(args);
    const auto full = RunCli(args, "/dev/full");
    CHECK(OneErrorLine(full));
    CHECK(full.err == "error: IOError: cannot write to standard output: No space left on device\n");
  }
  const auto trace = RunCli("load " + m.path + " --trace /nonexistent/dir/trace.json");
  CHECK(OneErrorLine(trace));
  CHECK(trace.err.find("--trace /nonexistent/dir/trace.json: cannot write there") != std::string::npos);
  CHECK(trace.out.empty());  // found before the load, not after it
  const std::string fifo = dir.Path("pipe.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto pipe = RunCli("inspect " + fifo);
  CHECK(OneErrorLine(pipe));
  CHECK(pipe.err.find("is a FIFO (named pipe): a checkpoint is a file or a folder") != std::string::npos);
}

TEST_CASE("cli: convert refuses bad flags, a device as output and packed GGUF blocks, leaving nothing "
          "(and dequantizes float8)", "[tools][cli]") {
  Model m;
  TempDir dir;
  const auto bad_dtype = RunCli("convert " + m.path + " " + dir.Path("o.safetensors") + " --dtype int4");
  CHECK(OneErrorLine(bad_dtype));
  CHECK(bad_dtype.err.find("--dtype int4: unknown dtype") != std::string::npos);
  const auto not_cast = RunCli("convert " + m.path + " " + dir.Path("o.safetensors") + " --dtype int8");
  CHECK(OneErrorLine(not_cast));
  CHECK(not_cast.err.find("--dtype int8") != std::string::npos);
  const auto shard = RunCli("convert " + m.path + " " + dir.Path("o") + " --max-shard-size lots");
  CHECK(OneErrorLine(shard));
  CHECK(shard.err.find("--max-shard-size") != std::string::npos);
  const auto variant = RunCli("convert " + m.path + " " + dir.Path("o.safetensors") + " --variant fp16");
  CHECK(OneErrorLine(variant));
  CHECK(variant.err.find("--variant names the files of a folder output") != std::string::npos);
  // The model's float8 weight has scales: --dtype writes it dequantized and drops them
  // (values: tests/reference/convert_check.py); without --dtype both are copied as stored.
  const auto fp8 = RunCli("convert " + m.path + " " + dir.Path("f.safetensors") + " --dtype bf16");
  CHECK(fp8.code == 0);
  const auto fp8_out = RunCli("inspect " + dir.Path("f.safetensors"));
  const size_t fp8_line = fp8_out.out.find("model.layers.1.mlp.fp8.weight ");
  REQUIRE(fp8_line != std::string::npos);
  CHECK(fp8_out.out.substr(fp8_line, fp8_out.out.find('\n', fp8_line) - fp8_line).find("BF16") !=
        std::string::npos);
  CHECK(fp8_out.out.find("weight_scale_inv") == std::string::npos);
  CHECK(RunCli("convert " + m.path + " " + dir.Path("s.safetensors")).code == 0);
  CHECK(RunCli("inspect " + dir.Path("s.safetensors")).out.find("weight_scale_inv") !=
        std::string::npos);
  const auto missing = RunCli("convert " + m.path);
  CHECK(missing.code != 0);
  CHECK(missing.err.find("out is required") != std::string::npos);
  // An output that is a device (a link to /dev/full): refused, never written through (a full
  // disk: cli_outputs_test).
  const std::string full = dir.Path("full.safetensors");
  REQUIRE(::symlink("/dev/full", full.c_str()) == 0);
  const auto device = RunCli("convert " + m.path + " " + full);
  CHECK(OneErrorLine(device));
  CHECK(device.err.find("is a character device, where a file is written") != std::string::npos);
  CHECK(device.out.empty());
  const std::string gguf = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/quantized.gguf";
  const auto packed = RunCli("convert " + gguf + " " + dir.Path("q.safetensors"));
  CHECK(OneErrorLine(packed));
  CHECK(packed.err.find("tensor 'q2_k' is Q2_K-packed, which --dtype would dequantize") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.Path("q.safetensors")));
  // A type loadstone does not decode (Q8_K) is refused with --dtype too.
  const auto q8k = RunCli("convert " + gguf + " " + dir.Path("q.safetensors") + " --dtype bf16");
  CHECK(OneErrorLine(q8k));
  CHECK(q8k.err.find("tensor 'q8_k' is Q8_K-packed, which loadstone does not dequantize") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.Path("q.safetensors")));
}

TEST_CASE("cli: bitsandbytes weights: inspect shows the scheme, plan --json the mode, load decodes",
          "[tools][cli]") {
  const std::string bnb4 = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/bnb/bnb4.safetensors";
  const auto inspect = RunCli("inspect " + bnb4);
  REQUIRE(inspect.code == 0);
  CHECK(inspect.out.find("nested.weight                                      bnb-nf4  [66, 515]") !=
        std::string::npos);
  const auto plan = RunCli("plan " + bnb4 + " --device-map cpu --dtype bf16 --json");
  INFO(plan.err);
  REQUIRE(plan.code == 0);
  const nlohmann::json doc = nlohmann::json::parse(plan.out);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& q : doc.at("quantized")) by_name[q.at("name")] = q;
  REQUIRE(by_name.size() == 9);
  CHECK(by_name.at("fp4.weight").at("scheme") == "bnb-fp4");
  CHECK(by_name.at("fp4.weight").at("mode") == "dequantize");
  CHECK(by_name.at("fp4.weight").at("bytes") == 8 * 40 * 2);
  const auto kept = nlohmann::json::parse(
      RunCli("plan " + bnb4 + " --device-map cpu --dtype bf16 --keep-packed --json").out);
  for (const auto& q : kept.at("quantized")) {
    CHECK(q.at("mode") == "packed");
    CHECK(q.at("dtype") == (q.at("name") == "storage_bf16.weight" ? "BF16" : "U8"));
  }
  const auto load = RunCli("load " + bnb4 + " --dtype f16 --json");
  INFO(load.err);
  REQUIRE(load.code == 0);
  size_t decoded = 0;
  const nlohmann::json loaded = nlohmann::json::parse(load.out);
  for (const auto& t : loaded.at("tensors")) {
    if (t.at("name") != "odd.weight") continue;
    ++decoded;
    CHECK(t.at("dtype") == "F16");
    CHECK(t.at("shape") == nlohmann::json::array({5, 7}));
  }
  CHECK(decoded == 1);
  // convert: dequantized with --dtype, the quant state dropped (values:
  // tests/reference/convert_check.py); without it, copied as stored with its state.
  TempDir dir;
  const auto plain = RunCli("convert " + bnb4 + " " + dir.Path("plain.safetensors") + " --dtype bf16 --json");
  INFO(plain.err);
  REQUIRE(plain.code == 0);
  CHECK(nlohmann::json::parse(plain.out).at("tensors") == 9);
  const auto stored = RunCli("convert " + bnb4 + " " + dir.Path("stored.safetensors") + " --json");
  REQUIRE(stored.code == 0);
  CHECK(nlohmann::json::parse(stored.out).at("tensors") == 42);
  // compressed-tensors: the scheme, and the name the weight has once decoded.
  const std::string ct = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/ct/pack.safetensors";
  const auto ct_inspect = RunCli("inspect " + ct);
  CHECK(ct_inspect.out.find("gidx4.weight_packed              ct-int4  [16, 128]") !=
        std::string::npos);
  const auto ct_convert = RunCli("convert " + ct + " " + dir.Path("ct.safetensors") + " --dtype bf16");
  REQUIRE(ct_convert.code == 0);
  const auto ct_out = RunCli("inspect " + dir.Path("ct.safetensors") + " --json");
  CHECK(ct_out.out.find("\"gidx4.weight\"") != std::string::npos);
  // GPTQ: the scheme from the model folder's config.json, the column as wide as it.
  const std::string gptq = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gptq/gptq4_v2";
  const auto gptq_inspect = RunCli("inspect " + gptq);
  CHECK(gptq_inspect.out.find("layer.qweight  gptq_v2-int4 [64, 128]") != std::string::npos);
  const auto gptq_plan = nlohmann::json::parse(RunCli("plan " + gptq + " --dtype f16 --json").out);
  REQUIRE(gptq_plan.at("quantized").size() == 1);
  CHECK(gptq_plan.at("quantized")[0].at("scheme") == "gptq_v2-int4");
  CHECK(gptq_plan.at("quantized")[0].at("mode") == "dequantize");
  const auto gptq_convert =
      RunCli("convert " + gptq + " " + dir.Path("gptq.safetensors") + " --dtype f16");
  REQUIRE(gptq_convert.code == 0);
  const auto gptq_out = RunCli("inspect " + dir.Path("gptq.safetensors") + " --json");
  CHECK(gptq_out.out.find("\"layer.weight\"") != std::string::npos);
  CHECK(gptq_out.out.find("qzeros") == std::string::npos);
  // On a (simulated) GPU: decoded by the workers, copied to the device.
  const auto gpu = RunCli("load " + bnb4 + " --device-map cuda:0 --assume-gpus 1x8GiB --dtype bf16 --json");
  INFO(gpu.err);
  REQUIRE(gpu.code == 0);
  const nlohmann::json on_gpu = nlohmann::json::parse(gpu.out);
  for (const auto& t : on_gpu.at("tensors")) {
    if (t.at("name") == "nested.weight") CHECK(t.at("device") == "cuda:0");
  }
}

TEST_CASE("cli: --dtype dequantizes GGUF blocks, --keep-packed keeps them, plan --json says which",
          "[tools][cli]") {
  const std::string blocks =
      std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/dequant/blocks.gguf";
  const auto plan = RunCli("plan " + blocks + " --device-map cpu --dtype bf16 --json");
  INFO(plan.err);
  REQUIRE(plan.code == 0);
  const nlohmann::json doc = nlohmann::json::parse(plan.out);
  REQUIRE(doc.at("quantized").size() == 20);
  for (const auto& q : doc.at("quantized")) {
    CHECK(q.at("mode") == "dequantize");
    CHECK(q.at("dtype") == "BF16");
  }
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& q : doc.at("quantized")) by_name[q.at("name")] = q;
  CHECK(by_name.at("Q4_K.weight").at("scheme") == "Q4_K");
  CHECK(by_name.at("Q4_K.weight").at("bytes") == 3 * 512 * 2);  // bf16 elements, not the blocks
  const auto kept = nlohmann::json::parse(
      RunCli("plan " + blocks + " --device-map cpu --dtype bf16 --keep-packed --json").out);
  for (const auto& q : kept.at("quantized")) CHECK(q.at("mode") == "packed");
  const auto human = RunCli("plan " + blocks + " --device-map cpu --dtype bf16");
  CHECK(human.out.find("quantized (dequantized into BF16):") != std::string::npos);
  CHECK(human.out.find("  Q6_K          2 dequantized      0 packed") != std::string::npos);
  // A type loadstone does not decode stays packed, and the plan says so.
  const std::string other = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/gguf/quantized.gguf";
  const auto q8k = RunCli("plan " + other + " --device-map cpu --dtype bf16");
  CHECK(q8k.err.find("1 Q8_K-packed tensor(s) (the first: 'q8_k') stay packed") != std::string::npos);
  CHECK(q8k.out.find("  Q8_K          0 dequantized      1 packed") != std::string::npos);
  // A load: 20 tensors, bf16 in their element shapes (2 bytes an element: more than the file).
  const auto load = RunCli("load " + blocks + " --dtype bf16 --json");
  INFO(load.err);
  REQUIRE(load.code == 0);
  const nlohmann::json loaded = nlohmann::json::parse(load.out);
  REQUIRE(loaded.at("tensors").size() == 20);
  for (const auto& t : loaded.at("tensors")) CHECK(t.at("dtype") == "BF16");
  for (const auto& t : loaded.at("tensors")) {
    if (t.at("name") == "Q4_0.weight") CHECK(t.at("shape") == nlohmann::json::array({3, 64}));
  }
  CHECK(loaded.at("placed_bytes").get<uint64_t>() > loaded.at("bytes").get<uint64_t>());
  // convert dequantizes with --dtype (values: tests/reference/convert_check.py); without it
  // the blocks would lose their type as bytes: refused, in one line, nothing written.
  TempDir dir;
  const auto convert = RunCli("convert " + blocks + " " + dir.Path("out.safetensors") + " --dtype f32");
  INFO(convert.err);
  CHECK(convert.code == 0);
  CHECK(std::filesystem::exists(dir.Path("out.safetensors")));
  const auto as_bytes = RunCli("convert " + blocks + " " + dir.Path("bytes.safetensors"));
  CHECK(OneErrorLine(as_bytes));
  CHECK(as_bytes.err.find("written as bytes it would lose its type; give --dtype f32, f16 or bf16") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.Path("bytes.safetensors")));
}

TEST_CASE("cli: messages that say what a file or folder is and what to pass", "[tools][cli]") {
  TempDir dir;
  std::filesystem::create_directories(dir.Path("empty"));
  CHECK(RunCli("inspect " + dir.Path("empty")).err.find("; the folder is empty") != std::string::npos);
  const std::string gguf = dir.Write("model.safetensors", std::string("GGUF\x03\0\0\0", 8) + std::string(64, '\0'));
  const auto g = RunCli("inspect " + gguf);
  CHECK(OneErrorLine(g));
  CHECK(g.err.find("it is a GGUF file (it starts with \"GGUF\"), not safetensors") != std::string::npos);
  const std::string zip = dir.Write("zip.safetensors", std::string("PK\x03\x04", 4) + std::string(64, 'x'));
  CHECK(RunCli("inspect " + zip).err.find("it is a zip archive (as torch.save writes") != std::string::npos);
  std::vector<std::byte> four(4);
  for (const char* sub : {"pipeline/unet", "pipeline/vae", "variant"}) {
    std::filesystem::create_directories(dir.Path(sub));
  }
  REQUIRE(WriteSafetensors(dir.Path("pipeline/unet/diffusion_pytorch_model.safetensors"),
                           {{"w", DType::kF32, {1}, four, {}}}).ok());
  REQUIRE(WriteSafetensors(dir.Path("pipeline/vae/diffusion_pytorch_model.safetensors"),
                           {{"w", DType::kF32, {1}, four, {}}}).ok());
  const auto pipeline = RunCli("inspect " + dir.Path("pipeline"));
  CHECK(pipeline.err.find("components hold the weights (unet, vae): pass --subfolder unet") !=
        std::string::npos);
  REQUIRE(WriteSafetensors(dir.Path("variant/model.fp16.safetensors"), {{"w", DType::kF16, {2}, four, {}}}).ok());
  CHECK(RunCli("inspect " + dir.Path("variant")).err.find("it has weights for variant fp16: pass --variant fp16") !=
        std::string::npos);
  const auto gpu = RunCli("load " + dir.Path("variant") + " --variant fp16 --device-map cuda:0");
  CHECK(OneErrorLine(gpu));
  CHECK(gpu.err.find("but the Loader has no GPU (CPU only: no CUDA device") != std::string::npos);
  CHECK(gpu.err.find("insufficient") == std::string::npos);
}


// `command` with `flags` warns `words` once on stderr and, under --json, in "warnings".
void CheckWarns(const std::string& command, const std::string& flags, const std::string& words) {
  INFO(command << " " << flags);
  const auto human = RunCli(command + " " + flags);
  INFO(human.err);
  REQUIRE(human.code == 0);
  CHECK(human.err.find("warning: " + words) != std::string::npos);
  const auto json = RunCli(command + " " + flags + " --json");
  INFO(json.out.substr(json.out.find("\"warnings\"")));
  REQUIRE(json.code == 0);
  size_t found = 0;
  const nlohmann::json doc = nlohmann::json::parse(json.out);
  for (const auto& w : doc["warnings"]) {
    found += w.get<std::string>().find(words) != std::string::npos;
  }
  CHECK(found == 1);
}

TEST_CASE("cli: options that change nothing warn on stderr and in --json, for load as for plan",
          "[tools][cli]") {
  Model m;
  TempDir dir;
  for (const std::string& command : {"load " + m.path, "plan " + m.path}) {
    CheckWarns(command, "--device-map auto --assume-gpus 2x80gb",
               "--assume-gpus 2x80gb: a lowercase 'b' means bits, as in accelerate (80gb = "
               "10000000000 bytes)");
    CheckWarns(command, "--device-map auto --assume-gpus 2x80",
               "--assume-gpus 2x80: a size without a unit is bytes (2 GPUs of 80 bytes each)");
    CheckWarns(command, "--max-memory cpu=10gb", "--max-memory cpu=10gb: a lowercase 'b' means bits");
    CheckWarns(command, "--device-map cpu --offload-folder " + dir.Path("off"),
               "offload_folder '" + dir.Path("off") + "' is not used: the device map sends no "
               "tensor to disk");
    CheckWarns(command, "--device-map cpu --mmap --dtype f32",
               "mmap maps only tensors loaded as stored: 8 of 9 CPU tensor(s) are converted "
               "(the first: '");
    CheckWarns(command, "--device-map cpu --fp8-block 64,64",
               "fp8_block 64x64 changes nothing: without a target dtype float8 weights load as "
               "stored");
    CheckWarns(command, R"(--device-map '{"model": 0, "nothing.here": 0, "lm_head": "cpu"}' )"
                        "--assume-gpus 1x1GiB",
               "The following device_map keys do not match any submodules in the model: "
               "['nothing.here']");
    CheckWarns(command, R"(--device-map '{"": 0}' --assume-gpus 1x1GiB --max-memory 0=100)",
               "max_memory is not used with an explicit device map: every tensor goes where the "
               "map says; it sends 98704 bytes to cuda:0, over its budget of 100");
  }
  CHECK_FALSE(std::filesystem::exists(dir.Path("off")));  // an unused folder is not made
  CheckWarns("load " + m.path, "--staging 64mb",
             "--staging 64mb: a lowercase 'b' means bits, as in accelerate (64mb = 8000000 bytes)");
  CheckWarns("load " + m.path, "--trace ''", "--trace '': no file named, so no trace is written");
}

TEST_CASE("cli: messages name the rule: GPU count, the multiplication sign, queue depth, dtype none",
          "[tools][cli]") {
  Model m;
  const auto many = RunCli("plan " + m.path + " --assume-gpus 65x1GiB");
  CHECK(OneErrorLine(many));
  CHECK(many.err.find("65 GPUs, and a simulated machine has at most 64") != std::string::npos);
  const auto times = RunCli("plan " + m.path + " --assume-gpus 2\u00d71GiB --json");
  INFO(times.err);
  REQUIRE(times.code == 0);
  CHECK(nlohmann::json::parse(times.out)["budgets"]["1"] == 1 << 30);  // 2 GPUs of 1 GiB
  const auto depth = RunCli("load " + m.path + " --queue-depth abc");
  CHECK(OneErrorLine(depth));
  CHECK(depth.err.find("--queue-depth abc: give the number of reads in flight, a whole number "
                       "from 1 to 4096") != std::string::npos);
  CHECK(OneErrorLine(RunCli("load " + m.path + " --queue-depth 0")));
  // --in-flight reaches the reader, which says so on the backend line.
  const auto zero = RunCli("load " + m.path + " --in-flight 0");
  CHECK(OneErrorLine(zero));
  CHECK(zero.err.find("--in-flight 0: give a size such as 64MiB") != std::string::npos);
  CHECK(OneErrorLine(RunCli("load " + m.path + " --in-flight lots")));
  const auto bounded = RunCli("load " + m.path + " --in-flight 8MiB --json");
  INFO(bounded.err);
  REQUIRE(bounded.code == 0);
  CHECK(nlohmann::json::parse(bounded.out)["backend"].get<std::string>().find(
            "at most 8 MiB in flight") != std::string::npos);
  for (const std::string dtype : {"none", "''"}) {
    const auto load = RunCli("load " + m.path + " --dtype " + dtype);
    INFO(load.err);
    CHECK(OneErrorLine(load));
    CHECK(load.err.find("leave --dtype out to load every tensor as stored") != std::string::npos);
  }
  CHECK(RunCli("plan " + m.path + " --dtype none").code == 0);
  CHECK(RunCli("plan --help").out.find(".gguf") != std::string::npos);
  CHECK(RunCli("convert --help").out.find("(default 64MiB)") != std::string::npos);
  CHECK(RunCli("load --help").out.find("(default 256MiB)") != std::string::npos);
  // inspect --json has "metadata" only when the files have some (docs/cli.md).
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/";
  const auto none = nlohmann::json::parse(
      RunCli("inspect " + fixtures + "safetensors/diffusers/unet --json").out);
  CHECK_FALSE(none.contains("metadata"));
  CHECK(nlohmann::json::parse(
            RunCli("inspect " + fixtures + "safetensors/metadata.safetensors --json").out)
            .contains("metadata"));
}

TEST_CASE("cli: a load whose every tensor goes to disk counts the offload's reads and writes",
          "[tools][cli][offload]") {
  // A checkpoint torch.save wrote: its tensors are written to the folder (not read in place).
  const std::string model = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/torch/sharded";
  TempDir dir;
  const std::string folder = dir.Path("off");
  const std::string flags = R"( --device-map '{"": "disk"}' --offload-folder )";
  const auto human = RunCli("load " + model + flags + folder);
  INFO(human.err);
  REQUIRE(human.code == 0);
  CHECK(human.out.find("-0.0") == std::string::npos);
  CHECK(human.out.find("loaded 0 tensors into memory") != std::string::npos);
  CHECK(human.out.find("no tensor goes to memory") != std::string::npos);
  CHECK(human.out.find("7 written to " + folder + "/index.json (") != std::string::npos);
  CHECK(human.out.find(", 368 B written in ") != std::string::npos);
  const auto json = RunCli("load " + model + flags + dir.Path("off2") + " --json");
  REQUIRE(json.code == 0);
  const auto doc = nlohmann::json::parse(json.out);
  CHECK(doc["first_tensor_ms"].is_null());
  CHECK(doc["offload"]["written_files"] == 7);
  CHECK(doc["offload"]["written_bytes"] == 368);
  CHECK(doc["offload"]["read_bytes"].get<uint64_t>() >= 368);  // every tensor's bytes, read
}

TEST_CASE("cli: an offload folder of many recast in-place entries gives one warning line",
          "[tools][cli][offload]") {
  TempDir dir;
  std::vector<std::vector<std::byte>> data(40, std::vector<std::byte>(64));
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 40; ++i) {
    tensors.push_back({"blocks." + std::to_string(i) + ".weight", DType::kF16, {32}, data[i], {}});
  }
  const std::string model = dir.Path("unet.safetensors");
  REQUIRE(WriteSafetensors(model, tensors).ok());
  // In place (plain safetensors), recorded as float32: what accelerate writes for a cast.
  REQUIRE(RunCli("load " + model + R"( --device-map '{"": "disk"}' --dtype f32 --offload-folder )" +
                 dir.Path("off")).code == 0);
  const auto load = RunCli("load " + dir.Path("off"));
  INFO(load.err);
  REQUIRE(load.code == 0);
  CHECK(std::count(load.err.begin(), load.err.end(), '\n') == 1);
  CHECK(load.err.find("in-place entries stored as float16 that the index says are float32: 40 "
                      "(the first: 'blocks.0.weight')") != std::string::npos);
}

TEST_CASE("cli: load says what was read with O_DIRECT, not only that it could be",
          "[tools][cli]") {
  Model m;
  const auto load = RunCli("load " + m.path + " --backend uring");
  REQUIRE(load.code == 0);
  const auto json = RunCli("load " + m.path + " --backend uring --json");
  REQUIRE(json.code == 0);
  const auto doc = nlohmann::json::parse(json.out);
  CHECK(doc["backend"].get<std::string>().find("O_DIRECT on") == std::string::npos);
  CHECK(load.out.find("\nread: ") != std::string::npos);
  CHECK(load.out.find(" from the device with O_DIRECT, ") != std::string::npos);
}

TEST_CASE("cli: convert --max-shard-size splits in the input's order, as huggingface_hub does",
          "[tools][cli]") {
  // A GGUF file in unsorted order with one tensor over the size; expected.json: huggingface_hub's
  // own split of the same tensors in the same order (tests/fixtures/make_shard_split_fixtures.py).
  const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/shard_split/";
  const nlohmann::json expected = nlohmann::json::parse(testing::Slurp(fixtures + "expected.json"));
  TempDir dir;
  const std::string out = dir.Path("out");
  const auto run = RunCli("convert " + fixtures + "unsorted.gguf " + out + " --max-shard-size " +
                          std::to_string(expected["max_shard_size"].get<uint64_t>()));
  INFO(run.err);
  REQUIRE(run.code == 0);
  const nlohmann::json index =
      nlohmann::json::parse(testing::Slurp(out + "/model.safetensors.index.json"));
  std::map<std::string, std::set<std::string>> got, want;
  for (const auto& [name, file] : index["weight_map"].items()) got[file.get<std::string>()].insert(name);
  for (const auto& [file, names] : expected["shards"].items()) {
    for (const auto& name : names) want[file].insert(name.get<std::string>());
  }
  CHECK(got == want);
}

}  // namespace
}  // namespace loadstone
