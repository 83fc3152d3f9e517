// The unpickler of io/formats/torch_pickle.h: a stack machine over a value arena that runs the
// opcodes of a torch.save pickle (torch_pickle.cc) and builds what the allowlisted globals
// stand for (pickle_calls.cc), bounded by io/formats/limits.h. Internal to those two files.
#ifndef LOADSTONE_IO_FORMATS_PICKLE_MACHINE_H_
#define LOADSTONE_IO_FORMATS_PICKLE_MACHINE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "io/formats/limits.h"
#include "io/formats/pickle_globals.h"
#include "io/formats/torch_pickle.h"
#include "loadstone/status.h"

namespace loadstone::io::pickle {

enum class Kind : uint8_t {
  kNone, kBool, kInt, kFloat, kStr, kBytes, kTuple, kList, kDict, kSet, kGlobal, kStorage, kTensor,
  kDevice,  // a torch.device: never equal to a str key
};

// "None", "an int", "a dict", ...: a value's kind, for messages.
std::string_view KindName(Kind kind);

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
        "writes for them, and runs nothing (docs/formats.md)",
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
  // Corruption unless `n`, the arguments of a call of `name`, is in [lo, hi].
  Status Arity(std::string_view name, size_t n, size_t lo, size_t hi) const;
  // The calls of Call(), one global kind each; `a` the arguments, `name` the global's.
  // torch._utils._rebuild_tensor{,_v2,_v3}(storage, offset, size, stride, ...): a tensor.
  Status CallRebuildTensor(const std::string& name, Global kind, const std::vector<Id>& a);
  // torch._utils._rebuild_parameter{,_with_state}, torch.nn.Parameter: the tensor, marked.
  Status CallParameter(const std::string& name, Global kind, const std::vector<Id>& a);
  // torch.Size(tuple) or torch.Size(): a tuple of the same items.
  Status CallSize(const std::string& name, const std::vector<Id>& a);
  // builtins.set(list or tuple) or builtins.set(): a set of the same items.
  Status CallSet(const std::string& name, const std::vector<Id>& a);
  // _codecs.encode(str, "latin1"): bytes.
  Status CallCodecsEncode(const std::string& name, const std::vector<Id>& a);
  Status SetItems(Id dict, const std::vector<Id>& kv);
  Result<uint64_t> NonNegative(Id id, std::string_view what) const;
  Result<std::vector<uint64_t>> Dims(Id id, std::string_view what) const;
  Status PersistentLoad(Id pid);
  // How many of the values of dict `dict` are tensors.
  size_t TensorsIn(Id dict) const;
  // The dict of tensors `root` is or holds: root when one of its values is a tensor, else the
  // first dict with tensors under one of kStateDictKeys, tried in that order (its key into
  // out_.state_dict_key). Unsupported when there is none or root is no dict.
  Result<Id> FindStateDict(Id root);
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

}  // namespace loadstone::io::pickle

#endif  // LOADSTONE_IO_FORMATS_PICKLE_MACHINE_H_
