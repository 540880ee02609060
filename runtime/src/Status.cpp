// Status.cpp - errors as values for the parax runtime.

#include "parax/runtime/Status.h"

#include <cstring>

namespace parax::runtime {

Status Status::error(std::string message, const char *file, int line) {
  Status status;
  status.message_ = std::move(message);
  status.file_ = file;
  status.line_ = line;
  return status;
}

const std::string &Status::message() const {
  static const std::string okMessage = "ok";
  return message_ ? *message_ : okMessage;
}

std::string Status::toString() const {
  if (isOk())
    return "ok";
  if (!file_)
    return *message_;
  const char *base = std::strrchr(file_, '/');
  return std::string(base ? base + 1 : file_) + ":" + std::to_string(line_) +
         ": " + *message_;
}

} // namespace parax::runtime
