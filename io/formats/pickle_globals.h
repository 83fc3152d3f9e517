// The globals a torch.save pickle may name, and what each is to the unpickler
// (io/formats/torch_pickle.h): an allowlist, checked by name. Nothing here calls anything.
#ifndef LOADSTONE_IO_FORMATS_PICKLE_GLOBALS_H_
#define LOADSTONE_IO_FORMATS_PICKLE_GLOBALS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loadstone/dtype.h"

namespace loadstone::io::pickle {

// What an allowlisted global builds when it is called (REDUCE, NEWOBJ) or used (a storage type
// in a persistent id, a dtype argument). Nothing here calls Python or anything like it.
enum class Global : uint8_t {
  kOrderedDict,
  kRebuildTensor,     // torch._utils._rebuild_tensor(storage, offset, size, stride)
  kRebuildTensorV2,   // (storage, offset, size, stride, requires_grad, hooks[, metadata])
  kRebuildTensorV3,   // (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
  kRebuildParameter,  // (tensor, requires_grad, hooks)
  kRebuildParameterWithState,  // (tensor, requires_grad, hooks, state)
  kParameter,         // torch.nn.parameter.Parameter(tensor[, requires_grad])
  kStorageType,       // torch.FloatStorage, ..., torch.UntypedStorage: only inside a storage id
  kDType,             // torch.float16, ...: only as an argument
  kSize,              // torch.Size(tuple)
  kDevice,            // torch.device(str[, index])
  kSet,               // builtins.set(list)
  kCodecsEncode,      // _codecs.encode(str, "latin1"): protocol 2's byte strings
  // torch.jit._pickle.restore_type_tag(value, "Dict[str, Tensor]"): LibTorch's pickle_save
  // tags its containers so; the value itself is what it builds.
  kRestoreTypeTag,
};

struct GlobalInfo {
  Global kind;
  DType dtype = DType::kU8;  // kStorageType, kDType
  bool untyped = false;      // kStorageType: UntypedStorage
};

// Why `module`.`name` (module names as Python 3 spells them) is refused outright — a module
// that reaches the operating system, a builtin that runs or reaches code — or nullopt.
std::optional<std::string> Blocked(std::string_view module, std::string_view name);

// What `module`.`name` is, when it is on the allowlist.
std::optional<GlobalInfo> LookUpGlobal(std::string_view module, std::string_view name);

}  // namespace loadstone::io::pickle

#endif  // LOADSTONE_IO_FORMATS_PICKLE_GLOBALS_H_
