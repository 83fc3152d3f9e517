// A hostile variant of a fixture: some of its tensors, edited, written as one safetensors file by
// loadstone's writer (the edit is the point; the values compared stay the producers').
#ifndef LOADSTONE_TESTS_TESTING_REWRITTEN_CHECKPOINT_H_
#define LOADSTONE_TESTS_TESTING_REWRITTEN_CHECKPOINT_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/writer.h"
#include "testing/file_bytes.h"
#include "testing/temp_dir.h"

namespace loadstone::testing {

// Edits the list of tensors to write; new bytes go into `data` (reserved: 16 more never move).
using TensorEdit = std::function<void(std::vector<TensorToWrite>* tensors,
                                      std::vector<std::vector<std::byte>>* data)>;

// The tensors of `source` whose names start with `prefix`, `edit`ed, written to DIR/`file`.
inline std::string Rewrite(const Checkpoint& source, const std::string& prefix, const TempDir& dir,
                           const TensorEdit& edit,
                           const std::string& file = "hostile.safetensors") {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  data.reserve(source.tensors().size() + 16);
  for (const TensorInfo& t : source.tensors()) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    data.push_back(FileBytes(source, t));
    tensors.push_back({t.name, t.dtype, t.shape, data.back(), {}});
  }
  edit(&tensors, &data);
  const std::string path = dir.Path(file);
  REQUIRE(WriteSafetensors(path, tensors).ok());
  return path;
}

// The tensor named `name` of `tensors` (the test fails without one).
inline TensorToWrite& Named(std::vector<TensorToWrite>* tensors, const std::string& name) {
  for (TensorToWrite& t : *tensors) {
    if (t.name == name) return t;
  }
  FAIL("no tensor " << name);
  return tensors->front();
}

// An edit that drops tensor `name`.
inline TensorEdit Without(std::string name) {
  return [name = std::move(name)](std::vector<TensorToWrite>* tensors, auto*) {
    std::erase_if(*tensors, [&](const TensorToWrite& t) { return t.name == name; });
  };
}

// An edit that gives tensor `name` the shape `shape`, its bytes cut to fit it (a shape that needs
// more keeps them all: a tensor that lies about its size).
inline TensorEdit Reshaped(std::string name, std::vector<uint64_t> shape) {
  return [name = std::move(name), shape = std::move(shape)](std::vector<TensorToWrite>* tensors,
                                                            auto*) {
    TensorToWrite& t = Named(tensors, name);
    t.shape = shape;
    t.data = t.data.subspan(0, std::min<uint64_t>(t.nbytes(), t.data.size()));
  };
}

// Each case's rewritten file is refused with `code` and a message containing `says`; the file
// rewritten without an edit opens. With a `config_json`, each is a model folder: that config.json
// beside a model.safetensors.
struct RefusedCase {
  std::string what;
  TensorEdit edit;
  StatusCode code;
  std::string says;
};
inline void CheckRefused(const Checkpoint& source, const std::string& prefix,
                         const std::vector<RefusedCase>& cases, const std::string& config_json = "") {
  auto open = [&](const TempDir& dir, const TensorEdit& edit) {
    if (config_json.empty()) return Checkpoint::Open(Rewrite(source, prefix, dir, edit));
    dir.Write("config.json", config_json);
    Rewrite(source, prefix, dir, edit, "model.safetensors");
    return Checkpoint::Open(dir.path());
  };
  for (const RefusedCase& c : cases) {
    INFO(c.what);
    TempDir dir;
    auto ckpt = open(dir, c.edit);
    REQUIRE_FALSE(ckpt.ok());
    INFO(ckpt.status().ToString());
    CHECK(ckpt.status().code() == c.code);
    CHECK_THAT(std::string(ckpt.status().message()), Catch::Contains(c.says));
  }
  TempDir dir;
  CHECK(open(dir, [](auto*, auto*) {}).ok());
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_REWRITTEN_CHECKPOINT_H_
