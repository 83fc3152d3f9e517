// What the parts of the LibTorch face share (module.cc: the model side; torch.cc: the load
// path; model_keys.cc: a module's keys against a checkpoint's). Internal to bindings/torch.
#ifndef LOADSTONE_BINDINGS_TORCH_INTERNAL_H_
#define LOADSTONE_BINDINGS_TORCH_INTERNAL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "loadstone/status.h"

namespace loadstone::libtorch {

// Runs `body`, turning LibTorch's exceptions (and any other) into a Status: out of memory as
// OutOfMemory, what this LibTorch cannot do (a CUDA tensor without CUDA) as Unsupported.
template <typename F>
auto Guarded(std::string_view what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::OutOfMemoryError& e) {
    return Status::OutOfMemory(fmt::format("{}: LibTorch: {}", what, e.what_without_backtrace()));
  } catch (const c10::NotImplementedError& e) {
    return Status::Unsupported(fmt::format("{}: LibTorch: {}", what, e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find("not linked with support for") != std::string::npos ||
        message.find("compiled without") != std::string::npos) {
      return Status::Unsupported(fmt::format("{}: this LibTorch cannot: {}", what, message));
    }
    return Status::InvalidArgument(fmt::format("{}: LibTorch refused: {}", what, message));
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(fmt::format("{}: out of host memory", what));
  } catch (const std::exception& e) {  // nothing of ours throws; LibTorch's std exceptions
    return Status::InvalidArgument(fmt::format("{}: LibTorch: {}", what, e.what()));
  }
}

// A loadstone shape as LibTorch sizes.
inline std::vector<int64_t> Sizes(const std::vector<uint64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end());
}

// "loadstone::testing::BasicTransformerBlockImpl" → "BasicTransformerBlock".
std::string ClassName(const torch::nn::Module& module);

}  // namespace loadstone::libtorch

#endif  // LOADSTONE_BINDINGS_TORCH_INTERNAL_H_
