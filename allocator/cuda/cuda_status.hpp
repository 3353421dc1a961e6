// Turns CUDA runtime and driver error codes into vramledger Status values whose message says
// which call failed, why (the CUDA error name and text), and with which arguments.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "allocator/errors.hpp"

namespace vramledger {

// What an invalid-handle error most likely refers to in a given call.
enum class HandleRole { kOther, kStream };

// Runtime error → Status. Also clears the runtime's last-error slot (cudaGetLastError), so one
// failed allocation does not surface again in the next unrelated cudaGetLastError() check, as
// PyTorch's error checks would otherwise report it. cudaErrorMemoryAllocation → kOutOfMemory;
// an invalid handle in a call whose only user-supplied handle is a stream → kInvalidStream.
Status runtime_status(cudaError_t error, std::string_view call, std::string_view args,
                      HandleRole role = HandleRole::kOther);

// Driver error → Status. CUDA_ERROR_OUT_OF_MEMORY → kOutOfMemory.
Status driver_status(CUresult result, std::string_view call, std::string_view args);

// Lazy forms for hot paths: the argument text is only built when the call failed.
template <typename MakeArgs>
Status check_runtime(cudaError_t error, std::string_view call, MakeArgs&& make_args,
                     HandleRole role = HandleRole::kOther) {
  if (error == cudaSuccess) [[likely]] return Status::ok();
  return runtime_status(error, call, make_args(), role);
}
template <typename MakeArgs>
Status check_driver(CUresult result, std::string_view call, MakeArgs&& make_args) {
  if (result == CUDA_SUCCESS) [[likely]] return Status::ok();
  return driver_status(result, call, make_args());
}

// "1073741824 B (1.00 GiB)": exact bytes for machines, a rounded figure for people.
std::string describe_bytes(std::size_t bytes);
// "0x7f0000000000".
std::string describe_address(std::uintptr_t address);

}  // namespace vramledger
