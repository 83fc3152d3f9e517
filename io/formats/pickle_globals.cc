#include "io/formats/pickle_globals.h"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>

namespace loadstone::io::pickle {
namespace {

// Modules that run programs or reach the interpreter: named in the refusal, whatever the name.
constexpr std::array<std::string_view, 8> kBlockedModules = {
    "os", "posix", "nt", "sys", "subprocess", "shutil", "socket", "importlib"};
constexpr std::array<std::string_view, 7> kBlockedBuiltins = {
    "eval", "exec", "getattr", "__import__", "compile", "open", "setattr"};

std::optional<DType> TorchDTypeName(std::string_view name) {
  static const std::pair<std::string_view, DType> kAliases[] = {
      {"float", DType::kF32},  {"double", DType::kF64}, {"half", DType::kF16},
      {"long", DType::kI64},   {"int", DType::kI32},    {"short", DType::kI16},
      {"cfloat", DType::kC64},
  };
  for (const auto& [alias, dtype] : kAliases) {
    if (name == alias) return dtype;
  }
  for (int d = 0; d < kNumDTypes; ++d) {
    if (TorchName(static_cast<DType>(d)) == name) return static_cast<DType>(d);
  }
  return std::nullopt;
}

std::optional<DType> StorageClassDType(std::string_view name) {
  static const std::pair<std::string_view, DType> kStorages[] = {
      {"FloatStorage", DType::kF32},          {"DoubleStorage", DType::kF64},
      {"HalfStorage", DType::kF16},           {"BFloat16Storage", DType::kBF16},
      {"LongStorage", DType::kI64},           {"IntStorage", DType::kI32},
      {"ShortStorage", DType::kI16},          {"CharStorage", DType::kI8},
      {"ByteStorage", DType::kU8},            {"BoolStorage", DType::kBool},
      {"ComplexFloatStorage", DType::kC64},   {"Float8_e4m3fnStorage", DType::kF8E4M3},
      {"Float8_e5m2Storage", DType::kF8E5M2}, {"Float8_e4m3fnuzStorage", DType::kF8E4M3FNUZ},
      {"Float8_e5m2fnuzStorage", DType::kF8E5M2FNUZ},
  };
  for (const auto& [storage, dtype] : kStorages) {
    if (name == storage) return dtype;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> Blocked(std::string_view module, std::string_view name) {
  const std::string_view top = module.substr(0, module.find('.'));
  if (std::find(kBlockedModules.begin(), kBlockedModules.end(), top) != kBlockedModules.end()) {
    return fmt::format("module '{}' is blocked: it reaches the operating system", top);
  }
  if (module == "builtins" &&
      std::find(kBlockedBuiltins.begin(), kBlockedBuiltins.end(), name) != kBlockedBuiltins.end()) {
    return "blocked: it runs or reaches code";
  }
  return std::nullopt;
}

std::optional<GlobalInfo> LookUpGlobal(std::string_view module, std::string_view name) {
  if (module == "collections" && name == "OrderedDict") return GlobalInfo{Global::kOrderedDict};
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor") return GlobalInfo{Global::kRebuildTensor};
    if (name == "_rebuild_tensor_v2") return GlobalInfo{Global::kRebuildTensorV2};
    if (name == "_rebuild_tensor_v3") return GlobalInfo{Global::kRebuildTensorV3};
    if (name == "_rebuild_parameter") return GlobalInfo{Global::kRebuildParameter};
    if (name == "_rebuild_parameter_with_state") {
      return GlobalInfo{Global::kRebuildParameterWithState};
    }
    return std::nullopt;
  }
  if (module == "torch.nn.parameter" && name == "Parameter") return GlobalInfo{Global::kParameter};
  if ((module == "torch" || module == "torch.storage") && name == "UntypedStorage") {
    return GlobalInfo{Global::kStorageType, DType::kU8, true};
  }
  if (module == "torch" || module == "torch.cuda") {
    if (auto dtype = StorageClassDType(name)) return GlobalInfo{Global::kStorageType, *dtype};
  }
  if (module == "torch") {
    if (name == "Size") return GlobalInfo{Global::kSize};
    if (name == "device") return GlobalInfo{Global::kDevice};
    if (auto dtype = TorchDTypeName(name)) return GlobalInfo{Global::kDType, *dtype};
  }
  if (module == "builtins" && name == "set") return GlobalInfo{Global::kSet};
  if (module == "_codecs" && name == "encode") return GlobalInfo{Global::kCodecsEncode};
  if (module == "torch.jit._pickle" && name == "restore_type_tag") {
    return GlobalInfo{Global::kRestoreTypeTag};
  }
  return std::nullopt;
}

}  // namespace loadstone::io::pickle
