// The opcodes of a torch.save pickle run by the machine of pickle_machine.h (with its dicts'
// SETITEMS and the kinds' names for messages), and the state dict taken from what they build.
#include "io/formats/torch_pickle.h"

#include <array>
#include <bit>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/formats/limits.h"
#include "io/formats/pickle_machine.h"
#include "io/formats/utf8.h"

namespace loadstone::io {
namespace pickle {

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

// Longer than 60 lines: the opcode switch, one case per pickle opcode, read as one table.
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

size_t Machine::TensorsIn(Id dict) const {
  size_t n = 0;
  const Value& d = values_[dict];
  for (size_t k = 1; k < d.items.size(); k += 2) n += values_[d.items[k]].kind == Kind::kTensor;
  return n;
}

Result<Id> Machine::FindStateDict(Id root) {
  if (values_[root].kind != Kind::kDict) {
    return Status::Unsupported(fmt::format(
        "'{}' holds {}, not a state dict (a dict of tensors)", where_, KindName(values_[root].kind)));
  }
  if (TensorsIn(root) > 0) return root;
  const Value& r = values_[root];
  for (std::string_view want : kStateDictKeys) {
    for (size_t k = 0; k + 1 < r.items.size(); k += 2) {
      const Value& key = values_[r.items[k]];
      if (key.kind == Kind::kStr && key.s == want && values_[r.items[k + 1]].kind == Kind::kDict &&
          TensorsIn(r.items[k + 1]) > 0) {
        out_.state_dict_key = key.s;
        return r.items[k + 1];
      }
    }
  }
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

Result<PickledStateDict> Machine::Extract(Id root) {
  LOADSTONE_ASSIGN_OR_RETURN(const Id dict, FindStateDict(root));
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

}  // namespace pickle

Result<PickledStateDict> ParseTorchPickle(std::string_view bytes, std::string_view where) {
  pickle::Machine machine(bytes, where);
  return machine.Run();
}

}  // namespace loadstone::io
