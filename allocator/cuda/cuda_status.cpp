#include "allocator/cuda/cuda_status.hpp"

#include <cstdint>
#include <cstdio>

#include "allocator/cuda/driver_api.hpp"

namespace vramledger {

namespace {

std::string compose(std::string_view call, std::string_view args, std::string_view name,
                    std::string_view text) {
  std::string message;
  message.reserve(call.size() + args.size() + name.size() + text.size() + 16);
  message.append(call).append("(").append(args).append(") failed: ");
  message.append(name).append(" (").append(text).append(")");
  return message;
}

}  // namespace

Status runtime_status(cudaError_t error, std::string_view call, std::string_view args,
                      HandleRole role) {
  if (error == cudaSuccess) return Status::ok();
  // Reset the last-error slot. Sticky errors (a kernel fault) cannot be cleared; they survive
  // this call and every later runtime call reports them, which is what we want.
  (void)cudaGetLastError();
  ErrorCode code = ErrorCode::kDriverError;
  if (error == cudaErrorMemoryAllocation) {
    code = ErrorCode::kOutOfMemory;
  } else if (role == HandleRole::kStream &&
             (error == cudaErrorInvalidResourceHandle || error == cudaErrorContextIsDestroyed)) {
    code = ErrorCode::kInvalidStream;
  } else if (error == cudaErrorInvalidValue) {
    code = ErrorCode::kInvalidArgument;
  }
  return {code, compose(call, args, cudaGetErrorName(error), cudaGetErrorString(error))};
}

Status driver_status(CUresult result, std::string_view call, std::string_view args) {
  if (result == CUDA_SUCCESS) return Status::ok();
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi* api = nullptr;
  if (load_driver_api(&api).is_ok()) {
    if (api->get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->get_error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  const std::string fallback = "CUresult " + std::to_string(static_cast<int>(result));
  ErrorCode code = ErrorCode::kDriverError;
  if (result == CUDA_ERROR_OUT_OF_MEMORY) {
    code = ErrorCode::kOutOfMemory;
  } else if (result == CUDA_ERROR_INVALID_VALUE) {
    code = ErrorCode::kInvalidArgument;
  } else if (result == CUDA_ERROR_NOT_SUPPORTED) {
    code = ErrorCode::kNotSupported;
  }
  return {code, compose(call, args, name ? name : fallback, text ? text : "no description")};
}

std::string describe_bytes(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char rounded[32];
  std::snprintf(rounded, sizeof(rounded), "%.2f %s", value, kUnits[unit]);
  return std::to_string(bytes) + " B (" + rounded + ")";
}

std::string describe_address(std::uintptr_t address) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace vramledger
