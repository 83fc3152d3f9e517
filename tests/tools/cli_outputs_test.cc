// What the CLI writes, run as a user would get it wrong: `demo --dir` at a folder of someone's
// files, `convert` with its output spelled as its input, outputs that exist, full disks,
// Ctrl-C. Each destructive spelling runs against a tree of sentinel files whose every byte is
// compared afterwards; nothing may change or vanish, and nothing may be left behind.
#include <sys/mount.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"
#include "tests/tools/cli_runner.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::RunCli;
using testing::Slurp;
using testing::TempDir;

// Every entry under `root`: a file's bytes, a link's target, "<dir>" for a folder.
std::map<std::string, std::string> Tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = fs::relative(it->path(), root).string();
    if (it->is_symlink()) {
      out[rel] = "<link> " + fs::read_symlink(it->path()).string();
    } else if (it->is_directory()) {
      out[rel] = "<dir>";
    } else {
      out[rel] = Slurp(it->path().string());
    }
  }
  return out;
}

// What differs between two trees, one entry a line ("" when nothing does).
std::string Changes(const std::map<std::string, std::string>& before,
                    const std::map<std::string, std::string>& after) {
  std::string out;
  for (const auto& [name, bytes] : before) {
    auto it = after.find(name);
    if (it == after.end()) out += "gone: " + name + "\n";
    else if (it->second != bytes) out += "changed: " + name + "\n";
  }
  for (const auto& [name, bytes] : after) {
    if (!before.count(name)) out += "new: " + name + "\n";
  }
  return out;
}

// A folder of the user's: a diffusers model as diffusers' save_pretrained wrote it (the
// fixture), a checkpoint torch.save wrote in shards, and files of their own.
struct UserFiles {
  TempDir dir;
  std::string home, diffusers, sharded;
  UserFiles() {
    const std::string fixtures = std::string(LOADSTONE_SOURCE_DIR) + "/tests/fixtures/";
    home = dir.Path("home");
    diffusers = home + "/sd";
    sharded = home + "/llm";
    fs::create_directories(home);
    fs::copy(fixtures + "safetensors/diffusers", diffusers, fs::copy_options::recursive);
    fs::copy(fixtures + "torch/sharded", sharded, fs::copy_options::recursive);
    dir.Write("home/sd/unet/config.json", R"({"_class_name": "UNet2DConditionModel"})");
    dir.Write("home/notes.txt", "my notes\n");
    dir.Write("home/llm/README.md", "# my model\n");
    dir.Write("home/sd.partial", "not the demo's\n");  // the demo's old scratch name
  }
};

bool OneErrorLine(const testing::CliRun& run, const std::string& words) {
  INFO(run.err);
  return run.code == 1 && run.err.starts_with("error: InvalidArgument: ") &&
         run.err.find(words) != std::string::npos &&
         run.err.find('\n') == run.err.size() - 1;
}

TEST_CASE("outputs: demo --dir refuses a folder or file it did not make, and touches nothing",
          "[tools][outputs]") {
  UserFiles u;
  const auto before = Tree(u.dir.path());
  for (const std::string& target : {u.diffusers, u.diffusers + "/unet", u.home, u.home + "/",
                                    u.home + "/notes.txt", u.sharded + "/../llm"}) {
    INFO(target);
    const auto run = RunCli("demo --layers 1 --dir " + target);
    CHECK((OneErrorLine(run, "the demo did not make") || OneErrorLine(run, "is a file")));
    CHECK(run.err.find("it is left as it is") != std::string::npos);
    CHECK(Changes(before, Tree(u.dir.path())) == "");
  }
}

TEST_CASE("outputs: demo --dir makes a new or empty folder, reuses it, and replaces only its own",
          "[tools][outputs]") {
  UserFiles u;
  const std::string empty = u.home + "/empty";
  fs::create_directories(empty);
  const auto before = Tree(u.dir.path());
  const auto made = RunCli("demo --layers 1 --dir " + empty);
  INFO(made.err);
  REQUIRE(made.code == 0);
  CHECK(fs::exists(empty + "/.loadstone-demo"));
  const std::string model = Slurp(empty + "/model.safetensors");
  // Reused as it is when complete.
  const auto again = RunCli("demo --layers 1 --dir " + empty);
  REQUIRE(again.code == 0);
  CHECK(Slurp(empty + "/model.safetensors") == model);
  // Another shape replaces the demo's own folder, whole; nothing is left beside it.
  REQUIRE(RunCli("demo --layers 2 --dir " + empty).code == 0);
  auto opened = Checkpoint::Open(empty);
  REQUIRE(opened.ok());
  CHECK(opened->tensors().size() == 21);
  // A new folder, two levels down.
  REQUIRE(RunCli("demo --layers 1 --dir " + u.home + "/new/demo").code == 0);
  auto after = Tree(u.dir.path());
  for (auto it = after.begin(); it != after.end();) {
    const bool demo = it->first.starts_with("home/empty/") || it->first.starts_with("home/new");
    it = demo ? after.erase(it) : std::next(it);
  }
  CHECK(Changes(before, after) == "");  // the user's files, every byte; no scratch beside them
  CHECK(Tree(empty).size() == 2);  // the model and the marker
}

TEST_CASE("outputs: the demo's next command runs as printed: this binary, a trace beside the model",
          "[tools][outputs]") {
  TempDir dir;
  const auto run = RunCli("demo --layers 1 --dir " + dir.Path("demo"));
  REQUIRE(run.code == 0);
  const size_t at = run.out.find("demo: next, try `");
  REQUIRE(at != std::string::npos);
  const size_t from = at + std::strlen("demo: next, try `");
  const std::string command = run.out.substr(from, run.out.find('`', from) - from);
  INFO(command);
  // The binary as it was run (here by its path: a shell would not find "loadstone" on PATH).
  CHECK(command.starts_with(fs::canonical(testing::Binary()).string() + " load " +
                            dir.Path("demo")));
  CHECK(std::system((command + " >/dev/null 2>&1").c_str()) == 0);
  CHECK(fs::exists(dir.Path("demo.trace.json")));
}

TEST_CASE("outputs: convert refuses an output that is, holds or lies in its input, however "
          "spelled", "[tools][outputs]") {
  UserFiles u;
  REQUIRE(::symlink(u.sharded.c_str(), u.dir.Path("home/link").c_str()) == 0);
  REQUIRE(::link((u.diffusers + "/unet/diffusion_pytorch_model.safetensors").c_str(),
                 u.dir.Path("home/hard.safetensors").c_str()) == 0);
  const std::string unet = u.diffusers + "/unet/diffusion_pytorch_model.safetensors";
  const auto before = Tree(u.dir.path());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {unet + " " + unet, "is the input"},
      {unet + " " + u.diffusers + "/unet/../unet/diffusion_pytorch_model.safetensors --overwrite",
       "is the input"},
      {unet + " " + u.dir.Path("home/hard.safetensors") + " --overwrite", "is the input"},
      {u.diffusers + "/unet " + u.diffusers + "/unet --dtype bf16", "is the input"},
      {u.diffusers + "/unet " + u.diffusers + "/unet/ --dtype bf16 --overwrite", "is the input"},
      {u.sharded + " " + u.sharded + " --max-shard-size 10MB", "is the input"},
      {u.sharded + " " + u.dir.Path("home/link") + " --overwrite", "is the input"},
      {u.sharded + " " + u.sharded + "/pytorch_model-00001-of-00003.bin --overwrite",
       "is the input"},
      {u.sharded + " " + u.sharded + "/new.safetensors", "lies inside the input folder"},
      {u.sharded + " " + u.sharded + "/sub/dir", "lies inside the input folder"},
      {u.sharded + "/pytorch_model.bin.index.json " + u.sharded + "/config.json.safetensors",
       "lies inside the input folder"},
      {u.sharded + " " + u.home + " --overwrite", "holds the input"},
      {u.diffusers + " --subfolder unet " + u.diffusers + " --overwrite", "is the input"},
      {u.diffusers + "/unet " + u.diffusers + " --overwrite", "holds the input"},
  };
  for (const auto& [args, words] : cases) {
    INFO(args);
    CHECK(OneErrorLine(RunCli("convert " + args), words));
    CHECK(Changes(before, Tree(u.dir.path())) == "");
  }
}

TEST_CASE("outputs: convert never replaces an existing output without --overwrite, and then only "
          "what it would write", "[tools][outputs]") {
  UserFiles u;
  const std::string unet = u.diffusers + "/unet";
  const std::string file = u.dir.Path("home/notes.txt");
  const auto before = Tree(u.dir.path());
  CHECK(OneErrorLine(RunCli("convert " + unet + " " + file), "is a file, where a folder"));
  // A folder holding a checkpoint (and the user's README): refused, with and without
  // --overwrite.
  CHECK(OneErrorLine(RunCli("convert " + unet + " " + u.sharded), "already exists"));
  CHECK(OneErrorLine(RunCli("convert " + unet + " " + u.sharded + " --overwrite"),
                     "which convert does not write, so --overwrite does not replace"));
  CHECK(Changes(before, Tree(u.dir.path())) == "");

  // An existing file: refused; with --overwrite replaced whole.
  const std::string out = u.dir.Path("out.safetensors");
  u.dir.Write("out.safetensors", "old bytes");
  CHECK(OneErrorLine(RunCli("convert " + unet + " " + out), "already exists"));
  CHECK(Slurp(out) == "old bytes");
  REQUIRE(RunCli("convert " + unet + " " + out + " --overwrite").code == 0);
  auto written = Checkpoint::Open(out);
  REQUIRE(written.ok());
  CHECK(written->tensors().size() == Checkpoint::Open(unet)->tensors().size());
  // A folder convert wrote: replaced whole with --overwrite, nothing of the old one left.
  const std::string folder = u.dir.Path("converted");
  REQUIRE(RunCli("convert " + u.sharded + " " + folder + " --max-shard-size 300").code == 0);
  CHECK(fs::exists(folder + "/model.safetensors.index.json"));
  CHECK(OneErrorLine(RunCli("convert " + unet + " " + folder), "already exists"));
  REQUIRE(RunCli("convert " + unet + " " + folder + " --overwrite").code == 0);
  const auto replaced = Tree(folder);
  CHECK(replaced.size() == 2);  // the old shards and index are gone
  CHECK(replaced.count("diffusion_pytorch_model.safetensors") == 1);
  CHECK(replaced.count("config.json") == 1);
  // An empty folder is written into.
  fs::create_directories(u.dir.Path("empty"));
  CHECK(RunCli("convert " + unet + " " + u.dir.Path("empty")).code == 0);
  CHECK(fs::exists(u.dir.Path("empty/diffusion_pytorch_model.safetensors")));
  // Nothing beside the outputs: no scratch files.
  for (const auto& [name, bytes] : Tree(u.dir.path())) {
    INFO(name);
    CHECK(name.find(".loadstone-") == std::string::npos);
  }
}

// A tmpfs of `bytes` mounted on `dir` for the test's life; unavailable without CAP_SYS_ADMIN.
struct SmallDisk {
  std::string dir;
  bool mounted = false;
  SmallDisk(const std::string& where, uint64_t bytes) : dir(where) {
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0,
                      ("size=" + std::to_string(bytes)).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

TEST_CASE("outputs: a full disk leaves nothing convert or a trace made, and what was there as "
          "it was", "[tools][outputs]") {
  UserFiles u;
  SmallDisk disk(u.dir.Path("small"), 256 << 10);
  if (!disk.mounted) {
    WARN("skipped: cannot mount a tmpfs here (needs root): " << std::strerror(errno));
    return;
  }
  u.dir.Write("small/mine.txt", std::string(4096, 'm'));
  // A model larger than the disk.
  const std::string model = u.dir.Path("big.safetensors");
  {
    std::vector<std::byte> data(1 << 20, std::byte{7});
    REQUIRE(WriteSafetensors(model, {{"w", DType::kU8, {1 << 20}, data, {}}}).ok());
  }
  const auto before = Tree(disk.dir);
  for (const std::string& out : {disk.dir + "/out.safetensors", disk.dir + "/folder",
                                 disk.dir + "/new/deeper/out.safetensors"}) {
    INFO(out);
    const auto run = RunCli("convert " + model + " " + out);
    CHECK(run.code == 1);
    CHECK(run.err.find("No space left on device") != std::string::npos);
    CHECK(Changes(before, Tree(disk.dir)) == "");  // no empty folder, no scratch file
  }
  // The trace: the load ends, its trace cannot be written whole: no 0-byte trace.json.
  const uint64_t left = fs::space(disk.dir).available;
  u.dir.Write("small/filler", std::string(left, 'f'));
  const auto full = Tree(disk.dir);
  const auto traced = RunCli("load " + model + " --trace " + disk.dir + "/trace.json");
  CHECK(traced.code == 1);
  CHECK(traced.err.find("No space left on device") != std::string::npos);
  CHECK(Changes(full, Tree(disk.dir)) == "");
}

TEST_CASE("outputs: --trace never replaces a file without --overwrite, and writes it whole",
          "[tools][outputs]") {
  UserFiles u;
  const std::string model = u.diffusers + "/unet";
  const std::string trace = u.dir.Path("home/notes.txt");
  const auto before = Tree(u.dir.path());
  const auto refused = RunCli("load " + model + " --trace " + trace);
  CHECK(OneErrorLine(refused, "the file exists: it is left as it is"));
  CHECK(refused.out.empty());  // found before the load
  CHECK(OneErrorLine(RunCli("load " + model + " --trace " + u.home), "not a regular file"));
  CHECK(Changes(before, Tree(u.dir.path())) == "");
  const auto replaced = RunCli("load " + model + " --trace " + trace + " --overwrite");
  INFO(replaced.err);
  REQUIRE(replaced.code == 0);
  CHECK(nlohmann::json::parse(Slurp(trace)).contains("traceEvents"));
  // A failed load (a missing folder) creates no trace file at all.
  const auto failed = RunCli("load " + u.dir.Path("nothing") + " --trace " + u.dir.Path("t.json"));
  CHECK(failed.code == 1);
  CHECK_FALSE(fs::exists(u.dir.Path("t.json")));
}

}  // namespace
}  // namespace loadstone
