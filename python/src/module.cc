// loadstone._core: the extension module under the Python package (python/loadstone).
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "errors.h"
#include "py_tensor.h"

NB_MODULE(_core, m) {
  m.doc() = "loadstone's C++ runtime (use the loadstone package, not this module)";
  loadstone::python::RegisterErrors(m);
  loadstone::python::RegisterTensor(m);
  loadstone::python::RegisterCheckpoint(m);
  loadstone::python::RegisterLoad(m);
  loadstone::python::RegisterModel(m);
}
