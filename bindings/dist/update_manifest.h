// The manifest of a weight update (weight_update.cc): what the trainer tells every rank before
// any weight moves — each tensor's name, dtype and full shape, the version, and how the tensors
// are cut into broadcasts — and how it travels.
#ifndef LOADSTONE_BINDINGS_DIST_UPDATE_MANIFEST_H_
#define LOADSTONE_BINDINGS_DIST_UPDATE_MANIFEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loadstone/weight_update.h"

namespace loadstone::dist {

struct Item {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
};

// What every rank must know of an update: its tensors, version and how they are cut into
// broadcasts (the trainer's options).
struct Manifest {
  uint64_t version = 0;
  uint64_t bucket_bytes = 0;
  uint64_t alone_bytes = 0;
  std::vector<Item> items;
};

// The broadcasts of an update, items [first, end) each: a tensor of m.alone_bytes or more alone,
// consecutive smaller ones packed up to m.bucket_bytes.
std::vector<std::pair<size_t, size_t>> Buckets(const Manifest& m);
uint64_t BucketBytes(const Manifest& m, std::pair<size_t, size_t> bucket);

// A tensor's dtype; InvalidArgument when it is not a contiguous tensor on the CPU.
Result<DType> DTypeOfTensor(const std::string& name, const at::Tensor& t);

// The trainer's manifest of `tensors`. Errors: InvalidArgument (a name twice, a tensor not on the
// CPU or not contiguous, a bucket of 0 bytes), Unsupported (a dtype loadstone lacks).
Result<Manifest> ManifestOf(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            uint64_t version, const WeightUpdateOptions& options);
std::string ToJson(const Manifest& m);
// Errors: InvalidArgument for anything but a manifest ToJson wrote (sizes bounded).
Result<Manifest> FromJson(const std::string& text);

// Rank `root`'s manifest text to every rank of the world: its size, then the text; `text` is
// what the root sends (empty: it refused the update, and every rank gets an IOError saying so).
Result<std::string> BroadcastManifest(ProcessGroups& groups, int root, std::string text);

}  // namespace loadstone::dist

#endif  // LOADSTONE_BINDINGS_DIST_UPDATE_MANIFEST_H_
