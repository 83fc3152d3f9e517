#include "errors.h"

#include <string>

#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace loadstone::python {

nb::object MakeException(const Status& status) {
  nb::object errors = nb::module_::import_("loadstone._errors");
  nb::object cls = errors.attr("class_for_code")(std::string(StatusCodeName(status.code())));
  return cls(std::string(status.message()));
}

void RegisterErrors(nb::module_& m) {
  (void)m;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    auto raise = [](const Status& status) {
      nb::object error = MakeException(status);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    };
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      raise(e.status());
    } catch (const Error& e) {
      raise(e.status());
    }
  });
}

}  // namespace loadstone::python
