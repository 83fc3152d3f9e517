// `loadstone plan`: the JSON accelerate would give, the human table, errors on one line.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "loadstone/writer.h"
#include "tests/testing/temp_dir.h"

namespace loadstone {
namespace {

struct Run {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Run Plan(const std::string& args) {
  testing::TempDir dir;
  std::string cmd = std::string(LOADSTONE_BINARY_DIR) + "/loadstone plan " + args + " >" +
                    dir.Path("out") + " 2>" + dir.Path("err");
  int status = std::system(cmd.c_str());
  Run run;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = Slurp(dir.Path("out"));
  run.err = Slurp(dir.Path("err"));
  return run;
}

const std::string kCases = std::string(LOADSTONE_SOURCE_DIR) + "/tests/data/devmap/";

TEST_CASE("plan --json: the device map of every devmap case, as accelerate writes it", "[tools][plan]") {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCases)) {
    std::string file = entry.path().filename().string();
    if (!file.ends_with(".input.json")) continue;
    std::string name = file.substr(0, file.size() - 11);
    Run run = Plan("--model-json " + entry.path().string() + " --json");
    INFO(name << "\n" << run.err);
    REQUIRE(run.code == 0);
    std::string expected = Slurp(kCases + name + ".output.json");
    while (!expected.empty() && expected.back() == '\n') expected.pop_back();
    expected.pop_back();  // the closing brace: the plan adds bytes_per_device and more
    CHECK(run.out.substr(0, expected.size() + 2) == expected + ", ");
    CHECK(run.out.find("\"bytes_per_device\": {") != std::string::npos);
    ++checked;
  }
  CHECK(checked >= 40);
}

TEST_CASE("plan: errors are one line on stderr with exit code 1", "[tools][plan]") {
  Run disk = Plan("--model-json " + kCases + "small-100-004.input.json --device-map disk");
  CHECK(disk.code == 1);
  CHECK(disk.out.empty());
  CHECK(disk.err.rfind("error: InvalidArgument: When passing device_map as a string", 0) == 0);
  CHECK(std::count(disk.err.begin(), disk.err.end(), '\n') == 1);
  Run size = Plan("--model-json " + kCases + "small-100-004.input.json --max-memory 0=5TB");
  CHECK(size.code == 1);
  CHECK(size.err == "error: InvalidArgument: --max-memory 0=5TB: `size` 5TB is not in a valid "
                    "format. Use an integer for bytes, or a string with an unit (like '5.0GB').\n");
  Run missing = Plan("/nonexistent/model.safetensors");
  CHECK(missing.code == 1);
  CHECK(missing.err.rfind("error: NotFound: ", 0) == 0);
  Run both = Plan("x --model-json y");
  CHECK(both.code == 1);
}

TEST_CASE("plan: a checkpoint, default no-split, overrides and the table", "[tools][plan]") {
  testing::TempDir dir;
  std::vector<TensorToWrite> tensors;
  std::vector<uint16_t> zeros(64, 0);
  auto bytes = std::as_bytes(std::span<const uint16_t>(zeros.data(), 64));
  tensors.push_back({"model.embed.weight", DType::kBF16, {64}, bytes, {}});
  for (int i = 0; i < 4; ++i) {
    tensors.push_back({"model.layers." + std::to_string(i) + ".w", DType::kBF16, {64}, bytes, {}});
  }
  tensors.push_back({"lm_head.weight", DType::kBF16, {64}, bytes, {}});
  REQUIRE(WriteSafetensors(dir.Path("model.safetensors"), tensors).ok());
  Run human = Plan(dir.path() + " --device-map sequential --max-memory 0=512,1=300,cpu=1000");
  INFO(human.out << human.err);
  REQUIRE(human.code == 0);
  CHECK(human.out.find("no-split: model.layers.* (default: repeated numbered blocks stay whole; "
                       "--no-split none turns it off)") != std::string::npos);
  CHECK(human.out.find("cuda:0") != std::string::npos);
  CHECK(human.out.find("planned") != std::string::npos);
  Run json = Plan(dir.path() + " --device-map sequential --max-memory 0=512,1=300,cpu=1000 --json");
  REQUIRE(json.code == 0);
  CHECK(json.out.rfind(R"({"device_map": {"lm_head": 0, "model.embed": 0, "model.layers.0": 0, )"
                       R"("model.layers.1": 1, "model.layers.2": 1, "model.layers.3": "cpu"}, )"
                       R"("bytes_per_device": {"0": 384, "1": 256, "cpu": 128}, )", 0) == 0);
  // A checkpoint is planned in placed bytes: bf16 cast up to f32 takes 4 bytes an element (where
  // accelerate, sizing min(dtype, stored), would say 768).
  Run f32 = Plan(dir.path() + " --device-map cpu --dtype f32 --json");
  CHECK(f32.out.rfind(R"({"device_map": {"": "cpu"}, "bytes_per_device": {"cpu": 1536})", 0) == 0);
  Run explain = Plan(dir.path() + " --device-map sequential --max-memory 0=512,cpu=1000 --no-split none --explain");
  CHECK(explain.out.find("Treating module model.") != std::string::npos);
  CHECK(explain.out.find("no-split: none") != std::string::npos);
}

TEST_CASE("plan --order: execution by default, file, a file of prefixes, and its errors",
          "[tools][plan]") {
  const std::string llama = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/tp/models/llama";
  const std::string deepseek = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/order/deepseek";
  Run execution = Plan(deepseek + " --json");
  REQUIRE(execution.code == 0);
  CHECK(execution.out.find(R"("order": "execution", "modules": [{"prefix":"model.embed_tokens")") !=
        std::string::npos);
  Run file = Plan(deepseek + " --order file --json");
  REQUIRE(file.code == 0);
  CHECK(file.out.find(R"("order": "file", "modules": [{"prefix":"lm_head","tensors":1)") !=
        std::string::npos);
  testing::TempDir dir;
  std::ofstream(dir.Path("order.txt")) << "# the head first\n  lm_head  \nmodel.layers.1\n\n";
  Run given = Plan(llama + " --order " + dir.Path("order.txt"));
  INFO(given.err);
  REQUIRE(given.code == 0);
  // The human line fits 80 columns: the first and last modules, the count between.
  CHECK(given.out.find("\norder: given, 5 modules: lm_head, … 3 more, model.norm\n") !=
        std::string::npos);
  Run given_json = Plan(llama + " --json --order " + dir.Path("order.txt"));
  REQUIRE(given_json.code == 0);
  CHECK(given_json.out.find(R"("modules": [{"prefix":"lm_head","tensors":1,"bytes":576},)"
                            R"({"prefix":"model.layers.1",)") != std::string::npos);
  Run missing = Plan(llama + " --order " + dir.Path("none.txt"));
  CHECK(missing.code == 1);
  CHECK(missing.err.rfind("error: InvalidArgument: --order: '" + dir.Path("none.txt") +
                              "' is not execution, file or a readable file",
                          0) == 0);
  std::ofstream(dir.Path("bad.txt")) << "model.layers.9\n";
  Run bad = Plan(llama + " --order " + dir.Path("bad.txt"));
  CHECK(bad.code == 1);
  CHECK(bad.err.find("prefix 'model.layers.9' of the given order names no tensor") !=
        std::string::npos);
  std::ofstream(dir.Path("empty.txt")) << "# nothing\n";
  CHECK(Plan(llama + " --order " + dir.Path("empty.txt")).err.find("names no module prefix") !=
        std::string::npos);
}

}  // namespace
}  // namespace loadstone
