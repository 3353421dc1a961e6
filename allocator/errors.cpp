#include "allocator/errors.hpp"

namespace vramledger {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidPointer: return "invalid pointer";
    case ErrorCode::kDoubleFree: return "double free";
    case ErrorCode::kInvalidStream: return "invalid stream";
    case ErrorCode::kDriverError: return "driver error";
    case ErrorCode::kNotSupported: return "not supported";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

void throw_if_error(const Status& status, std::string_view context) {
  if (status.is_ok()) return;
  if (status.code() == ErrorCode::kOutOfMemory) {
    throw OutOfMemoryError(std::string(context) + ": " + status.message());
  }
  throw Error(status.code(), std::string(context) + ": " + status.message());
}

}  // namespace vramledger
