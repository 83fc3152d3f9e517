// `loadstone load` in a real (pseudo-)terminal: the bar fits the width, never passes 100%, ends
// at 100%; the summary says how the bytes came; Ctrl-C cancels, says so, writes the trace and
// exits 130.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/writer.h"
#include "tests/tools/cli_runner.h"

namespace loadstone {
namespace {

using testing::RunInPty;
using testing::TempDir;

// Every frame the terminal shows: the text between carriage returns and newlines, with the
// "clear to end of line" sequence taken out.
std::vector<std::string> Frames(std::string screen) {
  for (size_t at; (at = screen.find("\x1b[K")) != std::string::npos;) screen.erase(at, 3);
  std::vector<std::string> frames;
  std::string current;
  for (char c : screen) {
    if (c == '\r' || c == '\n') {
      if (!current.empty()) frames.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) frames.push_back(current);
  return frames;
}

bool IsBar(const std::string& frame) { return frame.starts_with("[") && frame.find('%') != std::string::npos; }

// The bars: none wider than the terminal allows, none past 100%, the last at 100%.
void CheckBars(const std::string& screen, int columns) {
  const std::regex percent(R"(([0-9]+\.[0-9])%)");
  std::vector<std::string> bars;
  for (const std::string& f : Frames(screen)) {
    if (IsBar(f)) bars.push_back(f);
  }
  REQUIRE_FALSE(bars.empty());
  for (const std::string& bar : bars) {
    INFO(bar);
    CHECK(bar.size() <= static_cast<size_t>(columns - 1));
    std::smatch m;
    REQUIRE(std::regex_search(bar, m, percent));
    CHECK(std::stod(m[1]) <= 100.0);
  }
  CHECK(bars.back().find("100.0%") != std::string::npos);
}

std::string Line(const std::string& screen, std::string_view starts) {
  for (const std::string& f : Frames(screen)) {
    if (f.starts_with(starts)) return f;
  }
  return "";
}

// Runs loadstone with `argv` under an 80-column terminal and types Ctrl-C once, as soon as the
// screen shows `cue`; *pressed says whether it did.
testing::PtyRun CtrlCAfter(const std::vector<std::string>& argv, const std::string& cue,
                           bool* pressed) {
  *pressed = false;
  return RunInPty(argv, 80, [&](const std::string& screen, int fd) {
    if (!*pressed && screen.find(cue) != std::string::npos) {
      *pressed = true;
      REQUIRE(::write(fd, "\x03", 1) == 1);  // what Ctrl-C types
    }
  });
}

struct Models {
  TempDir dir;
  std::string llama, fp8;
  Models() {
    std::vector<std::vector<std::byte>> data;
    std::vector<TensorToWrite> tensors;
    // Tensors of 2 MiB: above the size that is coalesced, so that --mmap maps them.
    for (int i = 0; i < 8; ++i) data.emplace_back(2 << 20, std::byte{0x3c});
    for (int i = 0; i < 8; ++i) {
      tensors.push_back({"model.layers." + std::to_string(i) + ".w", DType::kBF16, {1024, 1024}, data[i], {}});
    }
    llama = dir.Path("llama");
    REQUIRE(WriteShardedSafetensors(llama, tensors, {.max_shard_size = 5'000'000}).ok());
    std::vector<std::byte> w(256 * 256, std::byte{0x38}), s(2 * 2 * 4);
    fp8 = dir.Path("fp8.safetensors");
    REQUIRE(WriteSafetensors(fp8, {{"w.weight", DType::kF8E4M3, {256, 256}, w, {}},
                                   {"w.weight_scale_inv", DType::kF32, {2, 2}, s, {}}})
                .ok());
  }
};

TEST_CASE("terminal: the bar fits 80 and 120 columns and ends at 100%, with and without casts",
          "[tools][terminal]") {
  Models m;
  struct Case {
    std::vector<std::string> args;
    std::string summary;  // in the "loaded ..." line
  };
  const std::vector<Case> cases = {
      {{"load", m.llama}, "16.00 MiB read at"},
      {{"load", m.llama, "--dtype", "f32"}, "16.00 MiB read at"},
      {{"load", m.llama, "--dtype", "f16"}, "16.00 MiB placed"},
      {{"load", m.fp8, "--dtype", "bf16"}, "128.02 KiB placed"},
      {{"load", m.llama, "--mmap"}, "16.00 MiB mapped (read from the file on first touch, not now), 0 B read"},
  };
  for (int columns : {80, 120}) {
    for (const Case& c : cases) {
      INFO(columns << " columns: " << c.args[1] << " " << (c.args.size() > 2 ? c.args[2] : ""));
      const auto run = RunInPty(c.args, columns);
      INFO(run.screen);
      REQUIRE_FALSE(run.timed_out);
      CHECK(run.code == 0);
      CheckBars(run.screen, columns);
      const std::string summary = Line(run.screen, "loaded ");
      CHECK(summary.find(c.summary) != std::string::npos);
      if (c.args.size() > 3 && c.args[3] == "f32") CHECK(summary.find("32.00 MiB placed") != std::string::npos);
      CHECK(run.screen.find("terminate called") == std::string::npos);
    }
  }
}

TEST_CASE("terminal: a load with disk offload draws its bar, then says what went to disk",
          "[tools][terminal]") {
  TempDir dir;
  const std::string bin =
      std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/offload/model/pytorch_model.bin";
  const auto run = RunInPty({"load", bin, "--device-map", "auto", "--max-memory", "cpu=25000",
                             "--offload-folder", dir.Path("off")},
                            80);
  INFO(run.screen);
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.code == 0);
  CheckBars(run.screen, 80);
  CHECK_THAT(Line(run.screen, "disk: "),
             Catch::Contains("7 tensors") && Catch::Contains("7 written to " + dir.Path("off")));
  const auto refused = RunInPty({"load", bin, "--device-map", "auto", "--max-memory", "cpu=25000"}, 80);
  CHECK(refused.code == 1);
  CHECK_THAT(refused.screen, Catch::Contains("Please provide an `offload_folder`"));
}

TEST_CASE("terminal: a narrow terminal gets a shorter line, never a wrapped one", "[tools][terminal]") {
  Models m;
  for (int columns : {20, 40, 60}) {
    INFO(columns);
    const auto run = RunInPty({"load", m.llama, "--dtype", "f32"}, columns);
    REQUIRE(run.code == 0);
    for (const std::string& f : Frames(run.screen)) {
      if (f.find('%') != std::string::npos && !f.starts_with("loaded")) {
        CHECK(f.size() <= static_cast<size_t>(columns - 1));
      }
    }
  }
}

// A checkpoint of holes: 1 GiB to read that costs no disk space, so that the load is still
// running when the test presses Ctrl-C at its first progress frame.
std::string SparseCheckpoint(const TempDir& dir) {
  const uint64_t n = 16, size = 64ULL << 20;
  nlohmann::ordered_json header;
  for (uint64_t i = 0; i < n; ++i) {
    header["model.layers." + std::to_string(i) + ".w"] = {
        {"dtype", "BF16"}, {"shape", {size / 2}}, {"data_offsets", {i * size, (i + 1) * size}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((text.size() >> (8 * b)) & 0xff);
  const std::string path = dir.Write("sparse.safetensors", bytes + text);
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(8 + text.size() + n * size)) == 0);
  return path;
}

TEST_CASE("terminal: Ctrl-C cancels the load, says what was done, writes the trace, exits 130",
          "[tools][terminal]") {
  TempDir dir;
  const std::string model = SparseCheckpoint(dir);
  const std::string trace = dir.Path("trace.json");
  bool pressed = false;
  // A cast and one read at a time keep it running for a second or more (it is cancelled after
  // a tenth of that), even on a fast machine.
  const auto run = CtrlCAfter({"load", model, "--dtype", "f32", "--backend", "pread",
                               "--queue-depth", "1", "--trace", trace},
                              "%", &pressed);
  INFO(run.screen);
  REQUIRE(pressed);
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.code == 130);
  const std::string cancelled = Line(run.screen, "cancelled (Ctrl-C) after ");
  CHECK(cancelled.find(" of 16 tensors in place") != std::string::npos);
  CHECK(cancelled.find("nothing is kept; trace written to " + trace) != std::string::npos);
  CHECK(Line(run.screen, "loaded ").empty());
  // The bar line was ended before the message: the message starts a line of its own.
  CHECK(run.screen.find("\ncancelled") != std::string::npos);
  // The terminal echoes the keystroke as "^C"; no bar is drawn after it (over it).
  const size_t echo = run.screen.find("^C");
  REQUIRE(echo != std::string::npos);
  for (const std::string& frame : Frames(run.screen.substr(echo))) CHECK_FALSE(IsBar(frame));
  const auto doc = nlohmann::json::parse(testing::Slurp(trace));
  bool failed = false;
  for (const auto& e : doc["traceEvents"]) failed = failed || e["name"] == "failed";
  CHECK(failed);
}

TEST_CASE("terminal: convert draws a bar that fits and ends at 100%, then lists its files",
          "[tools][terminal]") {
  Models m;
  for (int columns : {80, 40}) {
    INFO(columns);
    const std::string out = m.dir.Path("out" + std::to_string(columns));
    const auto run = RunInPty({"convert", m.llama, out, "--dtype", "f32", "--max-shard-size",
                               "10MiB"}, columns);
    INFO(run.screen);
    REQUIRE_FALSE(run.timed_out);
    CHECK(run.code == 0);
    CheckBars(run.screen, columns);
    CHECK(Line(run.screen, "converted 8 tensors (32.00 MiB) from safetensors in ").find(
              "into 5 file(s):") != std::string::npos);
    CHECK(std::filesystem::exists(out + "/model.safetensors.index.json"));
    CHECK(run.screen.find("\nconverted") != std::string::npos);  // the bar's line was ended
  }
}

TEST_CASE("terminal: Ctrl-C stops convert, says so, removes the partial output, exits 130",
          "[tools][terminal]") {
  TempDir dir;
  const std::string model = SparseCheckpoint(dir);
  const std::string out = dir.Path("new/folder/converted.safetensors");  // the folders too
  bool pressed = false;
  const auto run =
      CtrlCAfter({"convert", model, out, "--dtype", "f32", "--backend", "pread"}, "%", &pressed);
  INFO(run.screen);
  REQUIRE(pressed);
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.code == 130);
  CHECK(Line(run.screen, "cancelled (Ctrl-C) after ").find("the partial output was removed") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
  CHECK_FALSE(std::filesystem::exists(dir.Path("new")));  // the folders it made, gone with it
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);  // the model alone
}

TEST_CASE("terminal: Ctrl-C while the demo writes its model leaves nothing of it, exits 130",
          "[tools][terminal]") {
  TempDir dir;
  bool pressed = false;
  const auto run =
      CtrlCAfter({"demo", "--layers", "12", "--dir", dir.Path("demo")}, "demo: synthetic", &pressed);
  INFO(run.screen);
  REQUIRE(pressed);
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.code == 130);
  CHECK(Line(run.screen, "demo: cancelled (Ctrl-C) while writing the model; nothing of it is kept") !=
        "");
  CHECK(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace loadstone
