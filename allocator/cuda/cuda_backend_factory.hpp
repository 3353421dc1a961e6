// Entry points for code that wants a real backend without knowing the classes: pick one by the
// name it reports in BackendInfo::name, and find out whether a CUDA device is usable at all.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/device_backend.hpp"

namespace vramledger {

// The names make_cuda_backend accepts: "cuda_malloc", "vmm", "malloc_async".
const std::vector<std::string>& cuda_backend_names();

// Builds the named backend on CUDA device ordinal `device`. Throws Error(kInvalidArgument) for
// an unknown name, Error(kNotSupported) when the device lacks what the backend needs (VMM,
// memory pools) and Error(kDriverError / ...) when the device cannot be used. Never returns null.
std::unique_ptr<DeviceBackend> make_cuda_backend(std::string_view name, int device);

// True when the CUDA runtime finds a driver and at least one device. Never throws or aborts on
// machines without a driver or GPU, and leaves no runtime error behind: tests use it to skip.
bool cuda_device_available();
// Empty when a device is available; otherwise why not (the runtime's error name and text).
std::string cuda_device_unavailable_reason();

}  // namespace vramledger
