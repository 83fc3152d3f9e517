// AssembleShare (include/loadstone/tensor_parallel.h): a rank's tensors from what it read, the
// exchanged ones made from every rank's block in one all-to-all per bucket.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "loadstone/tensor_parallel.h"

namespace loadstone {
namespace {

// The layout of an exchanged tensor's parts: for each index `o` of the dimensions before the
// split one, each rank's intervals of it.
struct Layout {
  uint64_t outer = 1;
  uint64_t along = 0;
  uint64_t inner = 1;
};

Layout LayoutOf(const TensorShard& s) {
  Layout l;
  for (int d = 0; d < s.dim; ++d) l.outer *= s.full_shape[d];
  l.along = s.full_shape[s.dim];
  for (size_t d = s.dim + 1; d < s.full_shape.size(); ++d) l.inner *= s.full_shape[d];
  return l;
}

// Calls fn(src, dst, count) for each run of elements rank `to`'s part takes from rank `from`'s
// block: `src` counted from the block's first element, `dst` from the part's, in the part's
// order (the order both ranks agree on).
template <typename Fn>
void ForEachPiece(const TensorShard& s, const Layout& l, int from, int to, Fn&& fn) {
  const auto [a, b] = s.blocks[from];
  const auto& cut = s.cuts[to];
  uint64_t part_row = 0;  // elements of the part per index `o`
  for (const auto& [lo, hi] : cut) part_row += (hi - lo) * l.inner;
  const uint64_t row = l.along * l.inner;
  const uint64_t o_end = std::min(l.outer, row == 0 ? 0 : (b + row - 1) / row);
  for (uint64_t o = row == 0 ? 0 : a / row; o < o_end; ++o) {
    uint64_t at = o * part_row;
    for (const auto& [lo, hi] : cut) {
      const uint64_t first = (o * l.along + lo) * l.inner;
      const uint64_t end = (o * l.along + hi) * l.inner;
      const uint64_t x = std::max(first, a);
      const uint64_t y = std::min(end, b);
      if (x < y) fn(x - a, at + (x - first), y - x);
      at += end - first;
    }
  }
}

struct Exchanged {
  const TensorShard* shard;
  Layout layout;
  uint64_t elem = 0;                  // bytes per element, as loaded
  const std::byte* block = nullptr;   // this rank's block
  std::byte* part = nullptr;          // this rank's part
};

// Allocates this rank's part of `s` (64-byte aligned) as a Tensor.
Tensor NewPart(const TensorShard& s, DType dtype, uint64_t elem) {
  uint64_t numel = 1;
  for (uint64_t d : s.shape) numel *= d;
  const uint64_t nbytes = numel * elem;
  void* raw = ::operator new[](std::max<uint64_t>(nbytes, 1), std::align_val_t{64});
  std::shared_ptr<std::byte> memory(static_cast<std::byte*>(raw), [](std::byte* p) {
    ::operator delete[](p, std::align_val_t{64});
  });
  std::byte* data = memory.get();
  return Tensor(s.name, dtype, s.shape, "cpu", std::move(memory), data, nbytes);
}

// One all-to-all for the tensors of `bucket`: pack what each other rank needs, copy this rank's
// own pieces, exchange, unpack.
Status ExchangeBucket(const std::vector<Exchanged>& bucket, Exchange& exchange) {
  const int me = exchange.rank();
  const int n = exchange.size();
  std::vector<uint64_t> send_counts(n, 0);
  std::vector<uint64_t> recv_counts(n, 0);
  for (const Exchanged& x : bucket) {
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      ForEachPiece(*x.shard, x.layout, me, q,
                   [&](uint64_t, uint64_t, uint64_t c) { send_counts[q] += c * x.elem; });
      ForEachPiece(*x.shard, x.layout, q, me,
                   [&](uint64_t, uint64_t, uint64_t c) { recv_counts[q] += c * x.elem; });
    }
  }
  uint64_t send_total = 0;
  uint64_t recv_total = 0;
  for (int q = 0; q < n; ++q) send_total += send_counts[q], recv_total += recv_counts[q];
  // Every byte of both is written before it is read: no zero-fill.
  std::unique_ptr<std::byte[]> send(new std::byte[std::max<uint64_t>(send_total, 1)]);
  std::unique_ptr<std::byte[]> recv(new std::byte[std::max<uint64_t>(recv_total, 1)]);
  uint64_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (const Exchanged& x : bucket) {
      if (q == me) {
        ForEachPiece(*x.shard, x.layout, me, me, [&](uint64_t src, uint64_t dst, uint64_t c) {
          std::memcpy(x.part + dst * x.elem, x.block + src * x.elem, c * x.elem);
        });
        continue;
      }
      ForEachPiece(*x.shard, x.layout, me, q, [&](uint64_t src, uint64_t, uint64_t c) {
        std::memcpy(send.get() + at, x.block + src * x.elem, c * x.elem);
        at += c * x.elem;
      });
    }
  }
  LOADSTONE_RETURN_IF_ERROR(exchange.AllToAll({send.get(), send_total}, send_counts,
                                             {recv.get(), recv_total}, recv_counts));
  at = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    for (const Exchanged& x : bucket) {
      ForEachPiece(*x.shard, x.layout, r, me, [&](uint64_t, uint64_t dst, uint64_t c) {
        std::memcpy(x.part + dst * x.elem, recv.get() + at, c * x.elem);
        at += c * x.elem;
      });
    }
  }
  return Status::OK();
}

Status CheckExchange(const RankShare& share, const Exchange* exchange) {
  const bool needed = std::any_of(share.tensors.begin(), share.tensors.end(),
                                  [](const TensorShard& s) { return s.exchanged; });
  if (!needed || (exchange != nullptr && exchange->size() == share.options.tp &&
                  exchange->rank() == share.tp_rank)) {
    return Status::OK();
  }
  return Status::InvalidArgument(fmt::format(
      "rank {} (tensor-parallel rank {} of {}) needs an exchange of its group{}",
      share.options.rank, share.tp_rank, share.options.tp,
      exchange == nullptr ? ", and none was given"
                          : fmt::format(", and was given one where it is rank {} of {}",
                                        exchange->rank(), exchange->size())));
}

// What was loaded of `s`, on the CPU.
Result<const Tensor*> LoadedOf(const RankShare& share, const TensorShard& s,
                               const std::unordered_map<std::string_view, const Tensor*>& loaded) {
  auto it = loaded.find(s.name);
  if (it == loaded.end()) {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' of rank {}'s share was not loaded: give AssembleShare the tensors of a load "
        "of RankShare::reads",
        s.name, share.options.rank));
  }
  if (it->second->device() != "cpu") {
    return Status::InvalidArgument(fmt::format(
        "tensor '{}' is on {}: a tensor-parallel share is assembled on the CPU", s.name,
        it->second->device()));
  }
  return it->second;
}

}  // namespace

void CopyPartOf(const TensorShard& s, int rank, const std::byte* full, std::byte* part,
                uint64_t elem) {
  if (s.dim < 0) {
    uint64_t n = elem;
    for (uint64_t d : s.full_shape) n *= d;
    if (n > 0) std::memcpy(part, full, n);
    return;
  }
  const Layout l = LayoutOf(s);
  uint64_t at = 0;
  for (uint64_t o = 0; o < l.outer; ++o) {
    for (const auto& [lo, hi] : s.cuts[static_cast<size_t>(rank)]) {
      const uint64_t bytes = (hi - lo) * l.inner * elem;
      if (bytes > 0) std::memcpy(part + at, full + ((o * l.along + lo) * l.inner) * elem, bytes);
      at += bytes;
    }
  }
}

Result<std::vector<Tensor>> AssembleShare(const RankShare& share,
                                          const std::vector<Tensor>& loaded, Exchange* exchange) {
  LOADSTONE_RETURN_IF_ERROR(CheckExchange(share, exchange));
  std::unordered_map<std::string_view, const Tensor*> by_name;
  for (const Tensor& t : loaded) by_name.emplace(t.name(), &t);
  std::vector<Tensor> out;
  out.reserve(share.tensors.size());
  std::vector<std::vector<Exchanged>> buckets(1);
  uint64_t bucket_bytes = 0;
  for (const TensorShard& s : share.tensors) {
    LOADSTONE_ASSIGN_OR_RETURN(const Tensor* found, LoadedOf(share, s, by_name));
    const Tensor& t = *found;
    if (!s.exchanged) {
      out.push_back(t);
      continue;
    }
    const uint64_t elem = static_cast<uint64_t>(DTypeBits(t.dtype())) / 8;
    const auto [a, b] = s.blocks[share.tp_rank];
    if (elem == 0 || t.nbytes() != (b - a) * elem) {
      return Status::InvalidArgument(fmt::format(
          "tensor '{}': {} bytes loaded for a block of {} elements of {}", s.name, t.nbytes(),
          b - a, SafetensorsName(t.dtype())));
    }
    out.push_back(NewPart(s, t.dtype(), elem));
    uint64_t full = elem;
    for (uint64_t d : s.full_shape) full *= d;
    if (!buckets.back().empty() && bucket_bytes + full > share.options.bucket_bytes) {
      buckets.emplace_back();
      bucket_bytes = 0;
    }
    buckets.back().push_back({&s, LayoutOf(s), elem, t.data(), out.back().mutable_data()});
    bucket_bytes += full;
  }
  for (const auto& bucket : buckets) {
    if (bucket.empty()) continue;
    Status status = ExchangeBucket(bucket, *exchange);
    if (!status.ok()) {
      return status.WithContext(fmt::format("exchanging tensor-parallel parts ({} and {} more)",
                                            bucket.front().shard->name, bucket.size() - 1));
    }
  }
  return out;
}

}  // namespace loadstone
