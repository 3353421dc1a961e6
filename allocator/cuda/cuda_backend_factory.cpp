#include "allocator/cuda/cuda_backend_factory.hpp"

#include <cuda_runtime_api.h>

#include "allocator/cuda/cuda_malloc_backend.hpp"
#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/malloc_async_backend.hpp"
#include "allocator/cuda/vmm_backend.hpp"

namespace vramledger {

const std::vector<std::string>& cuda_backend_names() {
  static const std::vector<std::string> names = {"cuda_malloc", "vmm", "malloc_async"};
  return names;
}

std::unique_ptr<DeviceBackend> make_cuda_backend(std::string_view name, int device) {
  if (name == "cuda_malloc") return std::make_unique<CudaMallocBackend>(device);
  if (name == "vmm") return std::make_unique<VmmBackend>(device);
  if (name == "malloc_async") return std::make_unique<MallocAsyncBackend>(device);
  std::string known;
  for (const std::string& candidate : cuda_backend_names()) {
    known += (known.empty() ? "" : ", ") + candidate;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "unknown CUDA backend '" + std::string(name) + "' (known: " + known + ")");
}

std::string cuda_device_unavailable_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return runtime_status(error, "cudaGetDeviceCount", "").message();  // also clears the error
  }
  if (count == 0) return "cudaGetDeviceCount() found 0 devices";
  return {};
}

bool cuda_device_available() { return cuda_device_unavailable_reason().empty(); }

}  // namespace vramledger
