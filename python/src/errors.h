// loadstone::Status as Python exceptions: each code has its class in loadstone._errors
// (loadstone.NotFoundError is also a FileNotFoundError, InvalidArgumentError a ValueError, ...),
// and the message is the C++ message, file, tensor and offset intact.
#ifndef LOADSTONE_PYTHON_ERRORS_H_
#define LOADSTONE_PYTHON_ERRORS_H_

#include <exception>
#include <utility>

#include <nanobind/nanobind.h>

#include "loadstone/status.h"

namespace loadstone::python {

// Thrown by binding code for a non-OK Status; the translator raises the matching class.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return "loadstone status"; }

 private:
  Status status_;
};

// Throws StatusError unless `status` is OK.
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}
template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// The exception object for `status` (an instance of its loadstone._errors class). REQUIRES: the
// GIL, a non-OK status.
nanobind::object MakeException(const Status& status);

// Installs the translator of StatusError and loadstone::Error.
void RegisterErrors(nanobind::module_& m);

}  // namespace loadstone::python

#endif  // LOADSTONE_PYTHON_ERRORS_H_
