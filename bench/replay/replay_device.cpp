#include "bench/replay/replay_device.hpp"

#ifdef VRAMLEDGER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "allocator/cuda/cuda_backend_factory.hpp"
#endif

namespace vramledger {

bool is_simulated_backend(const std::string& backend) {
  return backend == "auto" || backend == "simulated";
}

ReplayDevice::ReplayDevice(const std::string& backend, double simulated_capacity_gib) {
  if (is_simulated_backend(backend)) {
    SimulatedDeviceOptions options;
    options.capacity_bytes =
        static_cast<std::size_t>(simulated_capacity_gib * double(std::size_t{1} << 30));
    options.allow_aliased_mappings = true;  // as the driver does (alias_pending_pages uses it)
    auto simulated = std::make_unique<SimulatedDevice>(options);
    simulated_ = simulated.get();
    backend_ = std::move(simulated);
    return;
  }
#ifdef VRAMLEDGER_HAVE_CUDA
  if (!cuda_device_available()) {
    throw Error(ErrorCode::kNotSupported,
                "backend '" + backend + "' needs a GPU: " + cuda_device_unavailable_reason());
  }
  backend_ = make_cuda_backend(backend, 0);
#else
  throw Error(ErrorCode::kNotSupported, "backend '" + backend +
                                            "' is not built into this binary (configure with "
                                            "the CUDA toolkit present: -Dcuda=enabled)");
#endif
}

ReplayDevice::~ReplayDevice() {
#ifdef VRAMLEDGER_HAVE_CUDA
  if (simulated_ == nullptr) {
    for (std::size_t i = 1; i < streams_.size(); ++i) {
      cudaStreamDestroy(reinterpret_cast<cudaStream_t>(streams_[i]));
    }
  }
#endif
}

StreamHandle ReplayDevice::stream(std::uint32_t index) {
  while (streams_.size() <= index) {
    if (simulated_ != nullptr) {
      streams_.push_back(simulated_->create_stream());
      continue;
    }
#ifdef VRAMLEDGER_HAVE_CUDA
    cudaStream_t stream = nullptr;
    const cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) {
      throw Error(ErrorCode::kDriverError,
                  std::string("cudaStreamCreateWithFlags failed: ") + cudaGetErrorString(status));
    }
    streams_.push_back(reinterpret_cast<StreamHandle>(stream));
#endif
  }
  return streams_[index];
}

std::string describe_policy(const Config& config, const DeviceBackend& backend) {
  const bool paged = config.options.use_paged_heap && backend.info().supports_virtual_memory;
  return std::string(paged ? "paged heap" : "segment heap") + " on " + backend.info().name;
}

}  // namespace vramledger
