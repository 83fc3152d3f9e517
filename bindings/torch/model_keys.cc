#include "model_keys.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"

namespace loadstone::libtorch {
namespace {

std::string TorchSize(c10::IntArrayRef sizes) {
  return fmt::format("torch.Size([{}])", fmt::join(sizes, ", "));
}

}  // namespace

std::vector<ModelKey> ModelKeys(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::vector<ModelKey> model_keys;
  for (const auto& [name, t] : state) {
    model_keys.push_back({name, std::vector<uint64_t>(t.sizes().begin(), t.sizes().end()),
                          t.is_floating_point()});
  }
  return model_keys;
}

Result<LoadReport> ReportKeys(const KeyMatch& match, const std::string& path,
                              const TorchLoadOptions& options) {
  if (!match.mismatched.empty() && !options.ignore_mismatched_sizes) {
    const ShapeMismatch& m = match.mismatched.front();
    return Status::InvalidArgument(fmt::format(
        "Cannot load {} because {} expected shape {}, but got {}. If you want to instead "
        "overwrite randomly initialized weights, please make sure to pass "
        "`ignore_mismatched_sizes=True` (TorchLoadOptions::ignore_mismatched_sizes).",
        path, m.key, TorchSize(Sizes(m.expected)), TorchSize(Sizes(m.found))));
  }
  LoadReport report;
  report.missing_keys = match.missing;
  report.unexpected_keys = match.unexpected;
  for (const ShapeMismatch& m : match.mismatched) {
    report.mismatched_keys.push_back({m.key, Sizes(m.expected), Sizes(m.found)});
  }
  return report;
}

Status RefuseUnmatched(const torch::nn::Module& model, const LoadReport& report,
                       const TorchLoadOptions& options) {
  if (!options.strict || (report.missing_keys.empty() && report.unexpected_keys.empty())) {
    return Status::OK();
  }
  std::string message = fmt::format("Error(s) in loading state_dict for {}:", ClassName(model));
  auto quoted = [](const std::vector<std::string>& keys) {
    std::vector<std::string> q;
    for (const auto& k : keys) q.push_back(fmt::format("\"{}\"", k));
    return fmt::format("{}", fmt::join(q, ", "));
  };
  if (!report.missing_keys.empty()) {
    message += fmt::format("\n\tMissing key(s) in state_dict: {}.", quoted(report.missing_keys));
  }
  if (!report.unexpected_keys.empty()) {
    message += fmt::format("\n\tUnexpected key(s) in state_dict: {}.", quoted(report.unexpected_keys));
  }
  return Status::InvalidArgument(message);
}

Fills FillsOf(const Checkpoint& checkpoint, const KeyMatch& match,
              const std::unordered_map<std::string, at::Tensor>& target) {
  Fills fills;
  for (const KeyFill& fill : match.fills) {
    const std::string& name = checkpoint.tensors()[fill.tensor].name;
    fills.include.insert(name);
    fills.param_of.emplace(name, target.at(fill.key));
  }
  return fills;
}

}  // namespace loadstone::libtorch
