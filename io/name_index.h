// A lookup from names to their positions in a sequence that holds them (a catalog's tensors, an
// index's entries), for the 100,000-name checkpoints: open addressing over one array of
// (hash, position) slots, so that a lookup reads one slot and, where the hashes agree, one name;
// no allocation per name, and positions rather than views, so a copy stays valid.
// Built once; Find may then be called from any thread.
#ifndef LOADSTONE_IO_NAME_INDEX_H_
#define LOADSTONE_IO_NAME_INDEX_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

namespace loadstone::io {

class NameIndex {
 public:
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();

  // Indexes the names name_of(0) .. name_of(n - 1) (n < 2^32). Returns the first position whose
  // name an earlier position already has (that position is left out), or kNone.
  template <typename NameOf>
  size_t Build(size_t n, NameOf name_of) {
    slots_.assign(std::bit_ceil(n * 2 + 2), Slot{});
    mask_ = slots_.size() - 1;
    size_t repeat = kNone;
    for (size_t i = 0; i < n; ++i) {
      const std::string_view name = name_of(i);
      const size_t h = std::hash<std::string_view>{}(name);
      size_t s = h & mask_;
      for (; slots_[s].position != 0; s = (s + 1) & mask_) {
        if (slots_[s].hash == static_cast<uint32_t>(h) &&
            name_of(slots_[s].position - 1) == name) {
          break;
        }
      }
      if (slots_[s].position != 0) {
        if (repeat == kNone) repeat = i;
        continue;
      }
      slots_[s] = {static_cast<uint32_t>(h), static_cast<uint32_t>(i + 1)};
    }
    return repeat;
  }

  // The position of `name`, if indexed; name_of is the accessor Build was given.
  template <typename NameOf>
  std::optional<size_t> Find(std::string_view name, NameOf name_of) const {
    if (slots_.empty()) return std::nullopt;
    const size_t h = std::hash<std::string_view>{}(name);
    for (size_t s = h & mask_; slots_[s].position != 0; s = (s + 1) & mask_) {
      if (slots_[s].hash == static_cast<uint32_t>(h) && name_of(slots_[s].position - 1) == name) {
        return slots_[s].position - 1;
      }
    }
    return std::nullopt;
  }

  bool empty() const { return slots_.empty(); }

 private:
  struct Slot {
    uint32_t hash = 0;      // the low bits of the name's hash
    uint32_t position = 0;  // its position + 1; 0: empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_NAME_INDEX_H_
