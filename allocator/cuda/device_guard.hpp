// Makes a device current for the duration of a scope and restores the caller's device after,
// so a backend for device 1 never leaves the calling thread switched away from its device.
#pragma once

#include <cuda_runtime_api.h>

#include "allocator/cuda/cuda_status.hpp"

namespace vramledger {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    // cudaGetDevice is a thread-local read; only switch (and later switch back) when needed.
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      status_ = runtime_status(cudaSetDevice(device), "cudaSetDevice",
                               "device=" + std::to_string(device));
      switched_ = status_.is_ok() && previous_ >= 0;
    }
  }
  ~DeviceGuard() {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // Not ok when the device could not be made current; the caller must not proceed.
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_;
};

}  // namespace vramledger
