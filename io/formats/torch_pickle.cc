#include "io/formats/torch_pickle.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "io/formats/limits.h"
#include "io/formats/utf8.h"

namespace loadstone::io {
namespace {

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

enum class Kind : uint8_t {
  kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kSet, kGlobal, kStorage, kTensor,
  kDevice,  // a torch.device: never equal to a str key
};

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "a bool";
    case Kind::kInt: return "an int";
    case Kind::kFloat: return "a float";
    case Kind::kStr: return "a str";
    case Kind::kBytes: return "bytes";
    case Kind::kTuple: return "a tuple";
    case Kind::kList: return "a list";
    case Kind::kDict: return "a dict";
    case Kind::kSet: return "a set";
    case Kind::kGlobal: return "a global";
    case Kind::kStorage: return "a storage";
    case Kind::kTensor: return "a tensor";
    case Kind::kDevice: return "a torch.device";
  }
  return "a value";
}

using Id = uint32_t;

struct Value {
  Kind kind = Kind::kNone;
  int64_t i = 0;                 // kBool, kInt; kStorage/kTensor: the record's index
  double f = 0;
  std::string s;                 // kStr, kBytes; kGlobal: "module.name"
  std::vector<Id> items;         // kTuple, kList, kSet; kDict: key, value, key, value, ...
  GlobalInfo global{Global::kOrderedDict};  // kGlobal
};

struct TensorRecord {
  uint32_t storage = 0;
  DType dtype = DType::kF32;
  uint64_t offset = 0;
  std::vector<uint64_t> size, stride;
  bool parameter = false;
};

class Machine {
 public:
  Machine(std::string_view bytes, std::string_view where)
      : in_(bytes),
        where_(where),
        // What a hostile stream may make the parser build or copy, in values and in items or
        // bytes: a multiple of its size (a torch.save state dict makes ~0.12 values per byte).
        max_values_(PickleMaxValues(bytes.size())),
        budget_(PickleMaxCopies(bytes.size())) {
    // Immutable values are shared, as Python shares them.
    none_ = New(Value{Kind::kNone});
    Value t{Kind::kBool}, f{Kind::kBool};
    t.i = 1;
    true_ = New(std::move(t));
    false_ = New(std::move(f));
    empty_tuple_ = New(Value{Kind::kTuple});
  }

  Result<PickledStateDict> Run();

 private:
  Status Step(uint8_t op);
  Status Corrupt(std::string_view what) const {
    return Status::Corruption(
        fmt::format("pickle of '{}': {} at byte {}; the file is damaged", where_, what, op_at_));
  }
  // A stream whose `what` grows past `bound` (= `value`, io/formats/limits.h).
  Status Bound(std::string_view what, std::string_view bound, uint64_t value) const {
    return BeyondBound(fmt::format("pickle of '{}' at byte {}", where_, op_at_), what, bound,
                       value);
  }
  Status Refuse(std::string_view what) const {
    return Status::Unsupported(fmt::format(
        "pickle of '{}': {} at byte {}; loadstone reads tensors and the containers torch.save "
        "writes for them, and runs nothing (shared/specs/torch-zip.md)",
        where_, what, op_at_));
  }

  // Reading the stream.
  Result<std::string_view> Take(uint64_t n) {
    if (n > in_.size() - pos_) return Corrupt("the stream ends inside an opcode (truncated)");
    std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  Result<uint64_t> Uint(int bytes) {
    LOADSTONE_ASSIGN_OR_RETURN(std::string_view b, Take(bytes));
    uint64_t v = 0;
    for (int k = bytes; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(b[k]);
    return v;
  }
  Result<std::string_view> Line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) return Corrupt("a GLOBAL without its newline (truncated)");
    std::string_view out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  // The value arena and the machine's stack. Push* refuse once the stream has built more than
  // its budget allows (Status in `limit_`, returned by Step).
  Id New(Value v) {
    Charge(v.items.size() + v.s.size());
    if (values_.size() >= max_values_ && limit_.ok()) {
      limit_ = Bound(fmt::format("a {}-byte pickle that builds more than {} values", in_.size(),
                                 max_values_),
                     "PickleMaxValues(bytes)", max_values_);
    }
    values_.push_back(std::move(v));
    return static_cast<Id>(values_.size() - 1);
  }
  // Items copied or bytes hashed: bounded by a multiple of the stream's size.
  void Charge(uint64_t n) {
    spent_ += n;
    if (spent_ > budget_ && limit_.ok()) {
      limit_ = Bound(fmt::format("a {}-byte pickle that copies more than {} items or bytes",
                                 in_.size(), budget_),
                     "PickleMaxCopies(bytes)", budget_);
    }
  }
  Id NewKind(Kind kind) { return New(Value{kind}); }
  Result<Id> Pop() {
    if (stack_.size() <= floor()) return Corrupt("stack underflow");
    Id id = stack_.back();
    stack_.pop_back();
    return id;
  }
  Result<Id> Top() const {
    if (stack_.size() <= floor()) return Corrupt("stack underflow");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The items pushed since the last MARK, which is removed.
  Result<std::vector<Id>> PopMark() {
    if (marks_.empty()) return Corrupt("no MARK to close");
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<Id> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    Charge(items.size());
    return items;
  }

  Status PushGlobal(std::string_view module, std::string_view name);
  Status Call(Id callable, Id args);
  Status SetItems(Id dict, const std::vector<Id>& kv);
  Result<uint64_t> NonNegative(Id id, std::string_view what) const;
  Result<std::vector<uint64_t>> Dims(Id id, std::string_view what) const;
  Status PersistentLoad(Id pid);
  Result<PickledStateDict> Extract(Id root);

  std::string_view in_;
  std::string_view where_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<Value> values_;
  std::vector<Id> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Id> memo_;
  std::vector<TensorRecord> tensors_;
  PickledStateDict out_;
  std::unordered_map<std::string, uint32_t> storage_by_key_;
  // Per dict: its str keys → the index of the key in its items.
  std::unordered_map<Id, std::unordered_map<std::string, size_t>> str_keys_;
  bool stopped_ = false;
  const uint64_t max_values_;
  const uint64_t budget_;
  uint64_t spent_ = 0;
  Status limit_;
  Id none_ = 0, true_ = 0, false_ = 0, empty_tuple_ = 0;
};

Status Machine::PushGlobal(std::string_view module_as_pickled, std::string_view name) {
  // Protocol 2 writes Python 2's module names; Python's unpickler maps them (fix_imports).
  const std::string_view module = module_as_pickled == "__builtin__" ? "builtins"
                                  : module_as_pickled == "copy_reg"  ? "copyreg"
                                                                     : module_as_pickled;
  const std::string full = fmt::format("{}.{}", module, name);
  const std::string_view top = module.substr(0, module.find('.'));
  if (std::find(kBlockedModules.begin(), kBlockedModules.end(), top) != kBlockedModules.end()) {
    return Refuse(fmt::format("unsupported global {} (module '{}' is blocked: it reaches the "
                              "operating system)", full, top));
  }
  if (module == "builtins" &&
      std::find(kBlockedBuiltins.begin(), kBlockedBuiltins.end(), name) != kBlockedBuiltins.end()) {
    return Refuse(fmt::format("unsupported global {} (blocked: it runs or reaches code)", full));
  }
  auto info = LookUpGlobal(module, name);
  if (!info) return Refuse(fmt::format("unsupported global {} (not on the allowlist)", full));
  Value v{Kind::kGlobal};
  v.s = full;
  v.global = *info;
  stack_.push_back(New(std::move(v)));
  return Status::OK();
}

Result<uint64_t> Machine::NonNegative(Id id, std::string_view what) const {
  const Value& v = values_[id];
  if (v.kind != Kind::kInt || v.i < 0) {
    return Corrupt(fmt::format("{} is {}, not a non-negative int", what, KindName(v.kind)));
  }
  return static_cast<uint64_t>(v.i);
}

Result<std::vector<uint64_t>> Machine::Dims(Id id, std::string_view what) const {
  const Value& v = values_[id];
  if (v.kind != Kind::kTuple) return Corrupt(fmt::format("{} is {}, not a tuple", what, KindName(v.kind)));
  if (v.items.size() > kMaxTensorRank) {
    return Bound(fmt::format("{} of {} dimensions (more than {})", what, v.items.size(),
                             kMaxTensorRank),
                 "kMaxTensorRank", kMaxTensorRank);
  }
  std::vector<uint64_t> dims;
  dims.reserve(v.items.size());
  for (Id item : v.items) {
    LOADSTONE_ASSIGN_OR_RETURN(uint64_t d, NonNegative(item, what));
    dims.push_back(d);
  }
  return dims;
}

Status Machine::PersistentLoad(Id pid) {
  // ("storage", storage_type, key, location, numel)
  const Value& p = values_[pid];
  if (p.kind != Kind::kTuple || p.items.size() != 5 || values_[p.items[0]].kind != Kind::kStr ||
      values_[p.items[0]].s != "storage") {
    return Corrupt("a persistent id that is not (\"storage\", type, key, location, numel)");
  }
  const Value& type = values_[p.items[1]];
  const Value& key = values_[p.items[2]];
  const Value& location = values_[p.items[3]];
  if (type.kind != Kind::kGlobal || type.global.kind != Global::kStorageType) {
    return Corrupt(fmt::format("a storage id whose type is {}, not a storage class",
                               KindName(type.kind)));
  }
  if (key.kind != Kind::kStr || location.kind != Kind::kStr) {
    return Corrupt("a storage id whose key or location is not a str");
  }
  LOADSTONE_ASSIGN_OR_RETURN(uint64_t numel, NonNegative(p.items[4], "a storage's numel"));
  auto [it, inserted] = storage_by_key_.emplace(key.s, static_cast<uint32_t>(out_.storages.size()));
  if (inserted) {
    out_.storages.push_back({key.s, type.global.dtype, type.global.untyped, numel, location.s});
  } else {
    const PickledStorage& seen = out_.storages[it->second];
    if (seen.dtype != type.global.dtype || seen.untyped != type.global.untyped ||
        seen.numel != numel) {
      return Corrupt(fmt::format("storage '{}' is described twice, differently", key.s));
    }
  }
  Value v{Kind::kStorage};
  v.i = it->second;
  stack_.push_back(New(std::move(v)));
  return Status::OK();
}

Status Machine::SetItems(Id dict, const std::vector<Id>& kv) {
  Value& d = values_[dict];
  if (d.kind != Kind::kDict) return Refuse(fmt::format("SETITEM on {}", KindName(d.kind)));
  if (kv.size() % 2) return Corrupt("SETITEMS with an odd number of items");
  for (size_t k = 0; k < kv.size(); k += 2) {
    const Value& key = values_[kv[k]];
    // A repeated str key replaces the earlier value, as in Python (found through the dict's
    // index: a state dict has 100k keys, a linear search would be quadratic).
    if (key.kind == Kind::kStr) {
      Charge(key.s.size());
      auto [it, inserted] = str_keys_[dict].emplace(key.s, d.items.size());
      if (!inserted) {
        values_[dict].items[it->second + 1] = kv[k + 1];
        continue;
      }
    }
    values_[dict].items.push_back(kv[k]);
    values_[dict].items.push_back(kv[k + 1]);
  }
  return Status::OK();
}

Status Machine::Call(Id callable, Id args_id) {
  const Value& fn = values_[callable];
  if (fn.kind != Kind::kGlobal) return Refuse(fmt::format("a call of {}", KindName(fn.kind)));
  const Value& args = values_[args_id];
  if (args.kind != Kind::kTuple) return Corrupt("call arguments that are not a tuple");
  const std::vector<Id> a = args.items;  // copied: New() below may move values_
  Charge(a.size());
  const std::string name = fn.s;
  const GlobalInfo g = fn.global;  // fn may move when a value is added
  auto want = [&](size_t lo, size_t hi) -> Status {
    if (a.size() < lo || a.size() > hi) {
      return Corrupt(fmt::format("{} called with {} arguments", name, a.size()));
    }
    return Status::OK();
  };
  switch (g.kind) {
    case Global::kOrderedDict:
      if (!a.empty()) return Refuse(fmt::format("{} called with arguments", name));
      stack_.push_back(NewKind(Kind::kDict));
      return Status::OK();
    case Global::kRebuildTensor:
    case Global::kRebuildTensorV2:
    case Global::kRebuildTensorV3: {
      const bool v3 = g.kind == Global::kRebuildTensorV3;
      if (g.kind == Global::kRebuildTensor) {
        LOADSTONE_RETURN_IF_ERROR(want(4, 4));
      } else {
        LOADSTONE_RETURN_IF_ERROR(want(v3 ? 7 : 6, v3 ? 8 : 7));
      }
      const Value& storage = values_[a[0]];
      if (storage.kind != Kind::kStorage) {
        return Corrupt(fmt::format("{} of {}, not a storage", name, KindName(storage.kind)));
      }
      TensorRecord t;
      t.storage = static_cast<uint32_t>(storage.i);
      const PickledStorage& s = out_.storages[t.storage];
      t.dtype = s.dtype;
      if (v3) {
        const Value& dtype = values_[a[6]];
        if (dtype.kind != Kind::kGlobal || dtype.global.kind != Global::kDType) {
          return Corrupt(fmt::format("{} with a dtype that is {}", name, KindName(dtype.kind)));
        }
        t.dtype = dtype.global.dtype;
      } else if (s.untyped) {
        return Corrupt(fmt::format("{} of an untyped storage without a dtype", name));
      }
      LOADSTONE_ASSIGN_OR_RETURN(t.offset, NonNegative(a[1], "a tensor's storage offset"));
      LOADSTONE_ASSIGN_OR_RETURN(t.size, Dims(a[2], "a tensor's size"));
      LOADSTONE_ASSIGN_OR_RETURN(t.stride, Dims(a[3], "a tensor's stride"));
      if (t.size.size() != t.stride.size()) {
        return Corrupt(fmt::format("a tensor with {} sizes and {} strides", t.size.size(),
                                   t.stride.size()));
      }
      tensors_.push_back(std::move(t));
      Value v{Kind::kTensor};
      v.i = static_cast<int64_t>(tensors_.size() - 1);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kRebuildParameter:
    case Global::kRebuildParameterWithState:
    case Global::kParameter: {
      if (g.kind == Global::kParameter) {
        LOADSTONE_RETURN_IF_ERROR(want(1, 2));
      } else {
        LOADSTONE_RETURN_IF_ERROR(
            want(g.kind == Global::kRebuildParameter ? 3 : 4,
                 g.kind == Global::kRebuildParameter ? 3 : 4));
      }
      const Value& data = values_[a[0]];
      if (data.kind != Kind::kTensor) {
        return Refuse(fmt::format("{} of {}, not a tensor", name, KindName(data.kind)));
      }
      tensors_[static_cast<size_t>(data.i)].parameter = true;
      stack_.push_back(a[0]);
      return Status::OK();
    }
    case Global::kRestoreTypeTag:
      LOADSTONE_RETURN_IF_ERROR(want(2, 2));
      if (values_[a[1]].kind != Kind::kStr) {
        return Corrupt(fmt::format("{} with a type that is {}", name, KindName(values_[a[1]].kind)));
      }
      stack_.push_back(a[0]);
      return Status::OK();
    case Global::kSize: {
      LOADSTONE_RETURN_IF_ERROR(want(0, 1));
      Value v{Kind::kTuple};
      if (!a.empty()) {
        if (values_[a[0]].kind != Kind::kTuple) return Corrupt("torch.Size of a non-tuple");
        v.items = values_[a[0]].items;
      }
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kDevice: {
      LOADSTONE_RETURN_IF_ERROR(want(1, 2));
      Value v{Kind::kDevice};
      if (values_[a[0]].kind == Kind::kStr) v.s = values_[a[0]].s;
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kSet: {
      LOADSTONE_RETURN_IF_ERROR(want(0, 1));
      Value v{Kind::kSet};
      if (!a.empty()) {
        const Kind k = values_[a[0]].kind;
        if (k != Kind::kList && k != Kind::kTuple) return Refuse("builtins.set of a non-list");
        v.items = values_[a[0]].items;
      }
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kCodecsEncode: {
      LOADSTONE_RETURN_IF_ERROR(want(2, 2));
      const Value& text = values_[a[0]];
      const Value& codec = values_[a[1]];
      if (text.kind != Kind::kStr || codec.kind != Kind::kStr ||
          (codec.s != "latin1" && codec.s != "latin-1")) {
        return Refuse("_codecs.encode other than (str, \"latin1\")");
      }
      // The str holds code points below 256 as UTF-8; latin1 maps each to one byte.
      Value v{Kind::kBytes};
      const std::string& s = text.s;
      for (size_t k = 0; k < s.size(); ++k) {
        const auto c = static_cast<uint8_t>(s[k]);
        if (c < 0x80) {
          v.s.push_back(static_cast<char>(c));
        } else if ((c == 0xC2 || c == 0xC3) && k + 1 < s.size()) {
          v.s.push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<uint8_t>(s[++k]) & 0x3F)));
        } else {
          return Refuse("_codecs.encode of a str that latin1 cannot encode");
        }
      }
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kStorageType:
    case Global::kDType:
      return Refuse(fmt::format("a call of {}", name));
  }
  return Refuse(fmt::format("a call of {}", name));
}

Status Machine::Step(uint8_t op) {
  switch (op) {
    case 0x80: {  // PROTO
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t p, Uint(1));
      if (p > 5) return Corrupt(fmt::format("pickle protocol {}", p));
      out_.protocol = static_cast<int>(p);
      return Status::OK();
    }
    case 0x95: {  // FRAME (protocol 4): a length prefix, nothing to do
      out_.protocol4_opcodes = true;
      return Uint(8).status();
    }
    case '.': stopped_ = true; return Status::OK();  // STOP
    case '(': marks_.push_back(stack_.size()); return Status::OK();  // MARK
    case 'N': stack_.push_back(none_); return Status::OK();
    case 0x88: stack_.push_back(true_); return Status::OK();   // NEWTRUE
    case 0x89: stack_.push_back(false_); return Status::OK();  // NEWFALSE
    case 'J':
    case 'K':
    case 'M': {  // BININT (i32), BININT1 (u8), BININT2 (u16)
      const int n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t raw, Uint(n));
      Value v{Kind::kInt};
      v.i = op == 'J' ? static_cast<int32_t>(static_cast<uint32_t>(raw)) : static_cast<int64_t>(raw);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case 0x8a: {  // LONG1: n bytes of little-endian two's complement
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t n, Uint(1));
      if (n > 8) return Refuse(fmt::format("an int of {} bytes", n));
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t raw, Uint(static_cast<int>(n)));
      if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~0ULL << (8 * n);  // sign-extend
      Value v{Kind::kInt};
      v.i = static_cast<int64_t>(raw);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case 'G': {  // BINFLOAT: big-endian double
      LOADSTONE_ASSIGN_OR_RETURN(std::string_view b, Take(8));
      uint64_t raw = 0;
      for (char c : b) raw = (raw << 8) | static_cast<uint8_t>(c);
      Value v{Kind::kFloat};
      v.f = std::bit_cast<double>(raw);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case 'X':
    case 0x8c:
    case 'U': {  // BINUNICODE (u32 length), SHORT_BINUNICODE (u8, protocol 4), SHORT_BINSTRING
      if (op == 0x8c) out_.protocol4_opcodes = true;
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t n, Uint(op == 'X' ? 4 : 1));
      LOADSTONE_ASSIGN_OR_RETURN(std::string_view s, Take(n));
      if (const size_t bad = FindInvalidUtf8(s); bad != std::string_view::npos) {
        return Corrupt(fmt::format("a string that is not UTF-8 (its byte {})", bad));
      }
      Value v{Kind::kStr};
      v.s = s;
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case ')': stack_.push_back(empty_tuple_); return Status::OK();
    case ']': stack_.push_back(NewKind(Kind::kList)); return Status::OK();
    case '}': stack_.push_back(NewKind(Kind::kDict)); return Status::OK();
    case 0x8f: stack_.push_back(NewKind(Kind::kSet)); return Status::OK();  // EMPTY_SET
    case 't': {  // TUPLE
      LOADSTONE_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
      Value v{Kind::kTuple};
      v.items = std::move(items);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      const size_t n = op - 0x84;
      if (stack_.size() < floor() + n) return Corrupt("stack underflow");
      Value v{Kind::kTuple};
      v.items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
      stack_.resize(stack_.size() - n);
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case 'a': {  // APPEND
      LOADSTONE_ASSIGN_OR_RETURN(Id item, Pop());
      LOADSTONE_ASSIGN_OR_RETURN(Id list, Top());
      if (values_[list].kind != Kind::kList) {
        return Refuse(fmt::format("APPEND to {}", KindName(values_[list].kind)));
      }
      values_[list].items.push_back(item);
      return Status::OK();
    }
    case 'e': {  // APPENDS
      LOADSTONE_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
      LOADSTONE_ASSIGN_OR_RETURN(Id list, Top());
      if (values_[list].kind != Kind::kList) {
        return Refuse(fmt::format("APPENDS to {}", KindName(values_[list].kind)));
      }
      values_[list].items.insert(values_[list].items.end(), items.begin(), items.end());
      return Status::OK();
    }
    case 's': {  // SETITEM
      LOADSTONE_ASSIGN_OR_RETURN(Id value, Pop());
      LOADSTONE_ASSIGN_OR_RETURN(Id key, Pop());
      LOADSTONE_ASSIGN_OR_RETURN(Id dict, Top());
      return SetItems(dict, {key, value});
    }
    case 'u': {  // SETITEMS
      LOADSTONE_ASSIGN_OR_RETURN(std::vector<Id> kv, PopMark());
      LOADSTONE_ASSIGN_OR_RETURN(Id dict, Top());
      return SetItems(dict, kv);
    }
    case 'c': {  // GLOBAL "module\nname\n"
      LOADSTONE_ASSIGN_OR_RETURN(std::string_view module, Line());
      LOADSTONE_ASSIGN_OR_RETURN(std::string_view name, Line());
      return PushGlobal(module, name);
    }
    case 0x93: {  // STACK_GLOBAL (protocol 4): module and name from the stack
      out_.protocol4_opcodes = true;
      LOADSTONE_ASSIGN_OR_RETURN(Id name, Pop());
      LOADSTONE_ASSIGN_OR_RETURN(Id module, Pop());
      if (values_[name].kind != Kind::kStr || values_[module].kind != Kind::kStr) {
        return Corrupt("STACK_GLOBAL of values that are not str");
      }
      const std::string m = values_[module].s, n = values_[name].s;
      return PushGlobal(m, n);
    }
    case 'R':
    case 0x81: {  // REDUCE (callable, args), NEWOBJ (class, args): the same allowlist
      LOADSTONE_ASSIGN_OR_RETURN(Id args, Pop());
      LOADSTONE_ASSIGN_OR_RETURN(Id callable, Pop());
      return Call(callable, args);
    }
    case 'b': {  // BUILD: only on a dict (OrderedDict's _metadata) or a tensor; state ignored
      LOADSTONE_ASSIGN_OR_RETURN(Id state, Pop());
      (void)state;
      LOADSTONE_ASSIGN_OR_RETURN(Id obj, Top());
      const Kind k = values_[obj].kind;
      if (k != Kind::kDict && k != Kind::kTensor) {
        return Refuse(fmt::format("BUILD on {}", KindName(k)));
      }
      return Status::OK();
    }
    case 'Q': {  // BINPERSID
      LOADSTONE_ASSIGN_OR_RETURN(Id pid, Pop());
      return PersistentLoad(pid);
    }
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t index, Uint(op == 'h' ? 1 : 4));
      auto it = memo_.find(index);
      if (it == memo_.end()) return Corrupt(fmt::format("memo index {} out of range", index));
      stack_.push_back(it->second);
      return Status::OK();
    }
    case 'q':
    case 'r': {  // BINPUT, LONG_BINPUT
      LOADSTONE_ASSIGN_OR_RETURN(uint64_t index, Uint(op == 'q' ? 1 : 4));
      LOADSTONE_ASSIGN_OR_RETURN(Id top, Top());
      memo_[index] = top;
      return Status::OK();
    }
    case 0x94: {  // MEMOIZE (protocol 4)
      out_.protocol4_opcodes = true;
      LOADSTONE_ASSIGN_OR_RETURN(Id top, Top());
      memo_[memo_.size()] = top;
      return Status::OK();
    }
    default:
      return Refuse(fmt::format("unsupported pickle opcode 0x{:02x}", op));
  }
}

// Keys tried, in this order, when the top-level dict holds no tensor itself.
constexpr std::array<std::string_view, 5> kStateDictKeys = {
    "state_dict", "model_state_dict", "model", "module", "ema"};

Result<PickledStateDict> Machine::Extract(Id root) {
  auto tensors_in = [&](Id dict) {
    size_t n = 0;
    const Value& d = values_[dict];
    for (size_t k = 1; k < d.items.size(); k += 2) n += values_[d.items[k]].kind == Kind::kTensor;
    return n;
  };
  if (values_[root].kind != Kind::kDict) {
    return Status::Unsupported(fmt::format(
        "'{}' holds {}, not a state dict (a dict of tensors)", where_, KindName(values_[root].kind)));
  }
  Id dict = root;
  if (tensors_in(root) == 0) {
    const Value& r = values_[root];
    std::optional<Id> found;
    for (std::string_view want : kStateDictKeys) {
      for (size_t k = 0; k + 1 < r.items.size() && !found; k += 2) {
        const Value& key = values_[r.items[k]];
        if (key.kind == Kind::kStr && key.s == want && values_[r.items[k + 1]].kind == Kind::kDict &&
            tensors_in(r.items[k + 1]) > 0) {
          found = r.items[k + 1];
          out_.state_dict_key = key.s;
        }
      }
      if (found) break;
    }
    if (!found) {
      std::string keys;
      for (size_t k = 0; k < r.items.size(); k += 2) {
        const Value& key = values_[r.items[k]];
        if (key.kind == Kind::kStr) keys += (keys.empty() ? "" : ", ") + key.s;
      }
      return Status::Unsupported(fmt::format(
          "'{}' holds a dict with no tensors (keys: {}); loadstone looks for tensors at the top "
          "level or under one of: state_dict, model_state_dict, model, module, ema",
          where_, keys.empty() ? "none" : keys));
    }
    dict = *found;
  }
  const Value& d = values_[dict];
  for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
    const Value& key = values_[d.items[k]];
    const Value& value = values_[d.items[k + 1]];
    const std::string key_text = key.kind == Kind::kStr ? key.s : std::string(KindName(key.kind));
    if (value.kind != Kind::kTensor) {
      out_.skipped.push_back(key_text);
      continue;
    }
    if (key.kind != Kind::kStr) {
      return Status::Unsupported(fmt::format("'{}': a tensor under a key that is {}, not a str",
                                             where_, KindName(key.kind)));
    }
    if (key.s.size() > kMaxTensorNameBytes) {
      return BeyondBound(fmt::format("state dict of '{}'", where_),
                         fmt::format("a tensor name of {} bytes ('{}...')", key.s.size(),
                                     key.s.substr(0, 40)),
                         "kMaxTensorNameBytes", kMaxTensorNameBytes);
    }
    if (out_.tensors.size() >= kMaxTensorsPerFile) {
      return BeyondBound(fmt::format("state dict of '{}'", where_),
                         fmt::format("tensor '{}', the {}th", key.s, out_.tensors.size() + 1),
                         "kMaxTensorsPerFile", kMaxTensorsPerFile);
    }
    const TensorRecord& t = tensors_[static_cast<size_t>(value.i)];
    out_.tensors.push_back({key.s, t.storage, t.dtype, t.offset, t.size, t.stride, t.parameter});
  }
  return std::move(out_);
}

Result<PickledStateDict> Machine::Run() {
  while (!stopped_) {
    if (pos_ >= in_.size()) return Corrupt("the stream ends before STOP (truncated)");
    op_at_ = pos_;
    const auto op = static_cast<uint8_t>(in_[pos_++]);
    LOADSTONE_RETURN_IF_ERROR(Step(op));
    if (!limit_.ok()) return limit_;
    // An opcode adds at most one entry to each: checked as each passes its bound.
    if (stack_.size() > kPickleMaxStack) {
      return Bound(fmt::format("its stack, growing past {}", kPickleMaxStack), "kPickleMaxStack",
                   kPickleMaxStack);
    }
    if (memo_.size() > kPickleMaxMemo) {
      return Bound(fmt::format("its memo, growing past {}", kPickleMaxMemo), "kPickleMaxMemo",
                   kPickleMaxMemo);
    }
    if (marks_.size() > kPickleMaxMarks) {
      return Bound(fmt::format("its open MARKs, more than {}", kPickleMaxMarks), "kPickleMaxMarks",
                   kPickleMaxMarks);
    }
  }
  if (!marks_.empty()) return Corrupt("STOP with an open MARK");
  if (stack_.size() != 1) return Corrupt(fmt::format("STOP with {} values on the stack", stack_.size()));
  return Extract(stack_.back());
}

}  // namespace

Result<PickledStateDict> ParseTorchPickle(std::string_view pickle, std::string_view where) {
  Machine machine(pickle, where);
  return machine.Run();
}

}  // namespace loadstone::io
