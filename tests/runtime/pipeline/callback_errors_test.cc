// What a callback that throws turns into: CallbackFailed naming the callback (on_tensor,
// on_progress, a tensor waiter), and for a waiter called once the load's end is decided, a count
// kept on the handle — never a line on stderr.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

#include "loadstone/loader.h"
#include "tests/runtime/pipeline/callback_test_util.h"

namespace loadstone {
namespace {

using testing::kBound;

TEST_CASE("callback errors: on_progress that throws is named, and the code is CallbackFailed") {
  testing::SmallModel model;
  Loader loader;
  LoadOptions options;
  options.on_progress = [](const Progress&) { throw std::runtime_error("the display is gone"); };
  const Status status = loader.Load(model.ckpt, model.plan, options).Done().get();
  INFO(status.ToString());
  CHECK(status.code() == StatusCode::kCallbackFailed);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith("LoadOptions::on_progress threw after tensor '") &&
                 Catch::EndsWith("': the display is gone"));
  CHECK(status.ToString().starts_with("CallbackFailed: "));
  CHECK(loader.Load(model.ckpt, model.plan).Done().get().ok());  // the Loader goes on
}

TEST_CASE("callback errors: an on-tensor callback and a tensor waiter that throw: CallbackFailed") {
  testing::SmallModel model;
  Loader loader;
  LoadOptions options;
  options.on_tensor = [](const Tensor&) { throw 42; };
  const Status thrown = loader.Load(model.ckpt, model.plan, options).Done().get();
  CHECK(thrown.code() == StatusCode::kCallbackFailed);
  CHECK_THAT(std::string(thrown.message()),
             Catch::StartsWith("an on-tensor callback threw for tensor '") &&
                 Catch::EndsWith("an exception that is not a std::exception"));

  // A waiter registered before its tensor lands (the on-tensor callback holds the load open).
  auto gate = std::make_shared<testing::Gate>();
  LoadOptions held;
  held.on_tensor = [gate](const Tensor&) { gate->Wait(); };
  LoadHandle load;
  const testing::OpenOnExit opener(gate);
  load = loader.Load(model.ckpt, model.plan, held);
  const std::string last = model.ckpt.tensors()[model.plan.tensors.back().source].name;
  REQUIRE(load.OnTensorReady(last, [](Status, Tensor) { throw std::runtime_error("no"); }).ok());
  gate->Open();
  REQUIRE(testing::Resolves(load.Done()));
  const Status waiter = load.Done().get();
  CHECK(waiter.code() == StatusCode::kCallbackFailed);
  CHECK(waiter.message() == "an OnTensorReady callback for tensor '" + last + "' threw: no");
}

// Everything written to stderr while `run` runs.
template <typename F>
std::string Stderr(const testing::TempDir& dir, F run) {
  const std::string path = dir.Path("stderr.txt");
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  std::FILE* file = std::fopen(path.c_str(), "w");
  REQUIRE(file != nullptr);
  ::dup2(::fileno(file), STDERR_FILENO);
  run();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::fclose(file);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("callback errors: OnDone callbacks that throw are counted on the handle, not printed") {
  testing::SmallModel model;
  Loader loader;
  LoadHandle load;
  Status late;
  const std::string printed = Stderr(model.dir, [&] {
    auto gate = std::make_shared<testing::Gate>();
    LoadOptions held;  // holds the load open until the OnDone callbacks are registered
    held.on_tensor = [gate](const Tensor&) { gate->Wait(); };
    const testing::OpenOnExit opener(gate);
    load = loader.Load(model.ckpt, model.plan, held);
    CHECK(load.late_callback_error().ok());
    REQUIRE(load.OnDone([](Status) { throw std::runtime_error("late boom"); }).ok());
    REQUIRE(load.OnDone([](Status) { throw std::runtime_error("and another"); }).ok());
    std::promise<void> last;
    REQUIRE(load.OnDone([&](Status) { last.set_value(); }).ok());
    gate->Open();
    REQUIRE(last.get_future().wait_for(kBound) == std::future_status::ready);
    late = load.late_callback_error();
  });
  CHECK(printed.empty());
  CHECK(load.Done().get().ok());  // a throw after the end does not change it
  CHECK(late.code() == StatusCode::kCallbackFailed);
  CHECK(late.message() ==
        "an OnDone callback threw after the load had ended: late boom (2 callbacks threw after "
        "the end in all; Done() is not changed by that)");
  // Once the load has finished, OnDone calls back at once and its exception reaches the caller.
  CHECK_THROWS_WITH(load.OnDone([](Status) { throw std::runtime_error("right here"); }),
                    "right here");
}

}  // namespace
}  // namespace loadstone
