// How the pipeline makes the Tensors it hands out: their names and shapes point into the
// checkpoint's catalog and their device names into one list per load, so that a tensor (and
// each copy of it) costs no allocation of its own — a 100,000-tensor load would otherwise keep
// two heap strings and a vector per tensor per copy.
#ifndef LOADSTONE_RUNTIME_PIPELINE_TENSOR_ACCESS_H_
#define LOADSTONE_RUNTIME_PIPELINE_TENSOR_ACCESS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"

namespace loadstone {

// What a load's tensors share, alive as long as any of them.
struct LoadNames {
  Checkpoint checkpoint;             // its tensors() hold the names and shapes
  std::vector<std::string> devices;  // "cpu", then "cuda:0", "cuda:1", ...
};

struct TensorAccess {
  // Tensor `info` (of names->checkpoint) on names->devices[device], as `dtype`; a packed tensor
  // `dequantized` has the shape of its elements (PackedLayout::element_shape).
  static Tensor Make(const std::shared_ptr<const LoadNames>& names, const TensorInfo& info,
                     size_t device, DType dtype, std::shared_ptr<void> owner, std::byte* data,
                     uint64_t nbytes, std::shared_ptr<const Tensor::HostCopier> copier,
                     bool dequantized = false) {
    Tensor t;
    t.names_owner_ = names;
    t.name_ = &info.name;
    t.shape_ = dequantized && info.packed ? &info.packed->element_shape : &info.shape;
    t.device_ = &names->devices.at(device);
    t.dtype_ = dtype;
    t.owner_ = std::move(owner);
    t.data_ = data;
    t.nbytes_ = nbytes;
    t.copier_ = std::move(copier);
    return t;
  }
};

}  // namespace loadstone

#endif  // LOADSTONE_RUNTIME_PIPELINE_TENSOR_ACCESS_H_
