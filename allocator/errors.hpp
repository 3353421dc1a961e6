// Error vocabulary shared by every layer. Backends report failures as Status values (driver
// calls return codes); the policy turns them into exceptions carrying a clear message.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace vramledger {

enum class ErrorCode {
  kOk = 0,
  kOutOfMemory,      // the device (or the configured cap) cannot hold the request
  kInvalidArgument,  // zero/overflowing size, malformed configuration, ...
  kInvalidPointer,   // pointer not owned by this allocator (foreign) or not a block start
  kDoubleFree,       // pointer owned by us but already freed
  kInvalidStream,    // unknown or destroyed stream
  kDriverError,      // the backend (driver) failed for another reason
  kNotSupported,     // operation not offered by this backend
  kInternal,         // broken invariant inside vramledger: always a bug
};

std::string_view to_string(ErrorCode code) noexcept;

// Result of a backend operation. Cheap to return on success (empty message).
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const noexcept { return code_ == ErrorCode::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Exception thrown by the policy and everything above it.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message) : Error(ErrorCode::kOutOfMemory, message) {}
};

// Throws Error(status.code(), context + ": " + status.message()) unless status is ok.
void throw_if_error(const Status& status, std::string_view context);
// The same with a context made only on failure: a context that formats sizes and addresses
// ("mapping 2.00 MiB (2097152 bytes) at 0x...") cost more than the simulated driver call it
// described, on every map, unmap and create that succeeded.
// (enable_if rather than a requires-clause: nvcc compiles this header as C++17 in tests/gpu.)
template <typename MakeContext,
          std::enable_if_t<std::is_invocable_r_v<std::string, MakeContext&>, int> = 0>
void throw_if_error(const Status& status, MakeContext&& make_context) {
  if (!status.is_ok()) throw_if_error(status, std::string_view(make_context()));
}

}  // namespace vramledger
