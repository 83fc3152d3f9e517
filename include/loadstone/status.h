// Status, Result<T> and Error: loadstone's one error model.
//
// A Status is either OK or holds a code and a message. OK is a null pointer, so returning
// success allocates nothing. Messages name what went wrong and where (file, tensor, byte
// offset) and, when there is one, the fix.
//
// Result<T> holds either a T or a non-OK Status. Error wraps a Status for the places that need
// an exception (failed futures, the C++ convenience API).
//
// Thread safety: Status, Result and Error are values; distinct objects may be used from
// different threads without synchronisation.
#ifndef LOADSTONE_STATUS_H_
#define LOADSTONE_STATUS_H_

#include <cassert>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loadstone {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller asked for something that cannot be (bad option, bad map)
  kNotFound,         // a file, tensor or device that does not exist
  kCorruption,       // a checkpoint that breaks its format's rules
  kIOError,          // the OS failed a read, open or write
  kOutOfMemory,      // host or device memory could not be had
  kUnsupported,      // a valid input that loadstone does not handle (yet)
  kCancelled,        // the work was cancelled before it finished
  // A callback the caller gave threw (LoadOptions::on_tensor, on_progress, destination, an
  // OnTensor / OnTensorReady / OnDone callback): the message names the callback, the tensor and
  // what it threw. Not the caller's arguments (InvalidArgument), nor loadstone's doing.
  kCallbackFailed,
};

// "InvalidArgument", "NotFound", ... ("OK" for kOk).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // OK
  Status(StatusCode code, std::string message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) {
    return Status(StatusCode::kCorruption, std::move(msg));
  }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status OutOfMemory(std::string msg) {
    return Status(StatusCode::kOutOfMemory, std::move(msg));
  }
  static Status Unsupported(std::string msg) {
    return Status(StatusCode::kUnsupported, std::move(msg));
  }
  static Status Cancelled(std::string msg) {
    return Status(StatusCode::kCancelled, std::move(msg));
  }
  static Status CallbackFailed(std::string msg) {
    return Status(StatusCode::kCallbackFailed, std::move(msg));
  }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }

  // "OK" or "<Code>: <message>".
  std::string ToString() const;

  // A copy with `context + ": "` in front of the message (OK stays OK).
  Status WithContext(std::string_view context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

// The exception form of a non-OK Status.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status);
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Either a value or a non-OK Status.
// REQUIRES: constructed from a non-OK Status when it holds no value.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "Result built from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kInvalidArgument, "Result without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

  // The value, or throws Error(status()).
  T ValueOrThrow() && {
    if (!ok()) throw Error(status_);
    return std::move(*value_);
  }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace loadstone

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define LOADSTONE_RETURN_IF_ERROR(expr)                  \
  do {                                                   \
    ::loadstone::Status loadstone_status_ = (expr);      \
    if (!loadstone_status_.ok()) return loadstone_status_; \
  } while (0)

#define LOADSTONE_CONCAT_INNER_(a, b) a##b
#define LOADSTONE_CONCAT_(a, b) LOADSTONE_CONCAT_INNER_(a, b)

// `LOADSTONE_ASSIGN_OR_RETURN(auto x, MakeX());` — x gets the value or the Status is returned.
#define LOADSTONE_ASSIGN_OR_RETURN(lhs, expr) \
  LOADSTONE_ASSIGN_OR_RETURN_IMPL_(LOADSTONE_CONCAT_(loadstone_result_, __LINE__), lhs, expr)
#define LOADSTONE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(tmp).value()

#endif  // LOADSTONE_STATUS_H_
