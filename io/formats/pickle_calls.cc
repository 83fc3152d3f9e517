// What the allowlisted globals of a torch.save pickle build (pickle_globals.h): a global pushed
// by name, a storage from a persistent id, and each call — a tensor record, a dict, a tuple —
// checked against what torch.save writes. Nothing is ever called.
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/formats/pickle_machine.h"

namespace loadstone::io::pickle {

Status Machine::PushGlobal(std::string_view module_as_pickled, std::string_view name) {
  // Protocol 2 writes Python 2's module names; Python's unpickler maps them (fix_imports).
  const std::string_view module = module_as_pickled == "__builtin__" ? "builtins"
                                  : module_as_pickled == "copy_reg"  ? "copyreg"
                                                                     : module_as_pickled;
  const std::string full = fmt::format("{}.{}", module, name);
  if (auto why = Blocked(module, name)) {
    return Refuse(fmt::format("unsupported global {} ({})", full, *why));
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

Status Machine::Arity(std::string_view name, size_t n, size_t lo, size_t hi) const {
  if (n < lo || n > hi) return Corrupt(fmt::format("{} called with {} arguments", name, n));
  return Status::OK();
}

Status Machine::CallRebuildTensor(const std::string& name, Global kind, const std::vector<Id>& a) {
  const bool v3 = kind == Global::kRebuildTensorV3;
  if (kind == Global::kRebuildTensor) {
    LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 4, 4));
  } else {
    LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), v3 ? 7 : 6, v3 ? 8 : 7));
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

Status Machine::CallParameter(const std::string& name, Global kind, const std::vector<Id>& a) {
  if (kind == Global::kParameter) {
    LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 1, 2));
  } else {
    const size_t n = kind == Global::kRebuildParameter ? 3 : 4;
    LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), n, n));
  }
  const Value& data = values_[a[0]];
  if (data.kind != Kind::kTensor) {
    return Refuse(fmt::format("{} of {}, not a tensor", name, KindName(data.kind)));
  }
  tensors_[static_cast<size_t>(data.i)].parameter = true;
  stack_.push_back(a[0]);
  return Status::OK();
}

Status Machine::CallSize(const std::string& name, const std::vector<Id>& a) {
  LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 0, 1));
  Value v{Kind::kTuple};
  if (!a.empty()) {
    if (values_[a[0]].kind != Kind::kTuple) return Corrupt("torch.Size of a non-tuple");
    v.items = values_[a[0]].items;
  }
  stack_.push_back(New(std::move(v)));
  return Status::OK();
}

Status Machine::CallSet(const std::string& name, const std::vector<Id>& a) {
  LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 0, 1));
  Value v{Kind::kSet};
  if (!a.empty()) {
    const Kind k = values_[a[0]].kind;
    if (k != Kind::kList && k != Kind::kTuple) return Refuse("builtins.set of a non-list");
    v.items = values_[a[0]].items;
  }
  stack_.push_back(New(std::move(v)));
  return Status::OK();
}

Status Machine::CallCodecsEncode(const std::string& name, const std::vector<Id>& a) {
  LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 2, 2));
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

Status Machine::Call(Id callable, Id args_id) {
  const Value& fn = values_[callable];
  if (fn.kind != Kind::kGlobal) return Refuse(fmt::format("a call of {}", KindName(fn.kind)));
  const Value& args = values_[args_id];
  if (args.kind != Kind::kTuple) return Corrupt("call arguments that are not a tuple");
  const std::vector<Id> a = args.items;  // copied: New() below may move values_
  Charge(a.size());
  const std::string name = fn.s;
  const GlobalInfo g = fn.global;  // fn may move when a value is added
  switch (g.kind) {
    case Global::kOrderedDict:
      if (!a.empty()) return Refuse(fmt::format("{} called with arguments", name));
      stack_.push_back(NewKind(Kind::kDict));
      return Status::OK();
    case Global::kRebuildTensor:
    case Global::kRebuildTensorV2:
    case Global::kRebuildTensorV3:
      return CallRebuildTensor(name, g.kind, a);
    case Global::kRebuildParameter:
    case Global::kRebuildParameterWithState:
    case Global::kParameter:
      return CallParameter(name, g.kind, a);
    case Global::kRestoreTypeTag:
      LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 2, 2));
      if (values_[a[1]].kind != Kind::kStr) {
        return Corrupt(fmt::format("{} with a type that is {}", name, KindName(values_[a[1]].kind)));
      }
      stack_.push_back(a[0]);
      return Status::OK();
    case Global::kSize:
      return CallSize(name, a);
    case Global::kDevice: {
      LOADSTONE_RETURN_IF_ERROR(Arity(name, a.size(), 1, 2));
      Value v{Kind::kDevice};
      if (values_[a[0]].kind == Kind::kStr) v.s = values_[a[0]].s;
      stack_.push_back(New(std::move(v)));
      return Status::OK();
    }
    case Global::kSet:
      return CallSet(name, a);
    case Global::kCodecsEncode:
      return CallCodecsEncode(name, a);
    case Global::kStorageType:
    case Global::kDType:
      return Refuse(fmt::format("a call of {}", name));
  }
  return Refuse(fmt::format("a call of {}", name));
}

}  // namespace loadstone::io::pickle
