// loadstone.Tensor: a loaded tensor handed to Python. It keeps loadstone's buffer alive and
// speaks DLPack (__dlpack__, __dlpack_device__), so torch.from_dlpack, numpy.from_dlpack and jax
// take it without a copy; the buffer lives until the last of them lets go.
#ifndef LOADSTONE_PYTHON_PY_TENSOR_H_
#define LOADSTONE_PYTHON_PY_TENSOR_H_

#include <nanobind/nanobind.h>

#include "loadstone/loader.h"

namespace loadstone::python {

void RegisterTensor(nanobind::module_& m);

// The Python object for `tensor`. REQUIRES: the GIL.
nanobind::object ToPython(const Tensor& tensor);

}  // namespace loadstone::python

#endif  // LOADSTONE_PYTHON_PY_TENSOR_H_
