// Status.h - errors as values for the parax runtime.
//
// Runtime functions return a Status (or StatusOr<T>) instead of throwing: a
// failure carries a message and the source file and line that raised it, and
// crosses the API as a value.

#ifndef PARAX_RUNTIME_STATUS_H
#define PARAX_RUNTIME_STATUS_H

#include <optional>
#include <string>
#include <utility>

namespace parax::runtime {

class Status {
public:
  Status() = default; // ok
  static Status ok() { return Status(); }
  static Status error(std::string message, const char *file = nullptr,
                      int line = 0);

  bool isOk() const { return !message_.has_value(); }
  explicit operator bool() const { return isOk(); }
  /// "file:line: message", or "ok".
  std::string toString() const;
  const std::string &message() const;

private:
  std::optional<std::string> message_;
  const char *file_ = nullptr;
  int line_ = 0;
};

template <typename T> class StatusOr {
public:
  StatusOr(T value) : value_(std::move(value)) {}
  StatusOr(Status status) : status_(std::move(status)) {}
  bool isOk() const { return status_.isOk(); }
  const Status &status() const { return status_; }
  T &value() { return *value_; }
  const T &value() const { return *value_; }

private:
  Status status_;
  std::optional<T> value_;
};

} // namespace parax::runtime

/// Makes an error Status that records where it was raised.
#define PARAX_ERROR(msg) ::parax::runtime::Status::error((msg), __FILE__, __LINE__)

#endif // PARAX_RUNTIME_STATUS_H
