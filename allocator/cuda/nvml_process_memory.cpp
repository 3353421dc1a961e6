#include "allocator/cuda/nvml_process_memory.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <vector>

#include "allocator/cuda/cuda_status.hpp"

namespace vramledger {

// The slice of NVML's C ABI we use, declared by hand from NVML's documentation so no nvml.h is
// needed to build. nvmlProcessInfo_t is the struct nvmlDeviceGetComputeRunningProcesses_v3 fills
// (named nvmlProcessInfo_v2_t in older headers); every field is laid out as the header does.
namespace nvml_abi {

using Return = int;  // nvmlReturn_t, a C enum
struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t

constexpr Return kSuccess = 0;            // NVML_SUCCESS
constexpr Return kInsufficientSize = 7;   // NVML_ERROR_INSUFFICIENT_SIZE
constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

struct ProcessInfo {                   // nvmlProcessInfo_t (v2 layout, used by _v3 queries)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;          // 0xFFFFFFFF unless MIG
  unsigned int computeInstanceId;
};
static_assert(sizeof(ProcessInfo) == 24 && offsetof(ProcessInfo, usedGpuMemory) == 8 &&
              offsetof(ProcessInfo, computeInstanceId) == 20);

struct Memory {                        // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace nvml_abi

// Where the real header is installed (the GPU machine has it under /usr/local/cuda), prove the
// hand-written layout matches it.
#if __has_include(<nvml.h>)
#include <nvml.h>
static_assert(sizeof(nvmlProcessInfo_t) == sizeof(nvml_abi::ProcessInfo));
static_assert(offsetof(nvmlProcessInfo_t, pid) == offsetof(nvml_abi::ProcessInfo, pid));
static_assert(offsetof(nvmlProcessInfo_t, usedGpuMemory) ==
              offsetof(nvml_abi::ProcessInfo, usedGpuMemory));
static_assert(offsetof(nvmlProcessInfo_t, gpuInstanceId) ==
              offsetof(nvml_abi::ProcessInfo, gpuInstanceId));
static_assert(offsetof(nvmlProcessInfo_t, computeInstanceId) ==
              offsetof(nvml_abi::ProcessInfo, computeInstanceId));
static_assert(sizeof(nvmlMemory_t) == sizeof(nvml_abi::Memory));
static_assert(sizeof(nvmlReturn_t) == sizeof(nvml_abi::Return));
static_assert(NVML_ERROR_INSUFFICIENT_SIZE == nvml_abi::kInsufficientSize);
#endif

struct NvmlProcessMemory::Api {
  nvml_abi::Return (*init)() = nullptr;      // nvmlInit_v2
  nvml_abi::Return (*shutdown)() = nullptr;  // nvmlShutdown
  const char* (*error_string)(nvml_abi::Return) = nullptr;
  nvml_abi::Return (*handle_by_pci_bus_id)(const char*, nvml_abi::Device*) = nullptr;
  nvml_abi::Return (*handle_by_uuid)(const char*, nvml_abi::Device*) = nullptr;
  nvml_abi::Return (*compute_processes)(nvml_abi::Device, unsigned int*,
                                        nvml_abi::ProcessInfo*) = nullptr;
  nvml_abi::Return (*memory_info)(nvml_abi::Device, nvml_abi::Memory*) = nullptr;

  Status check(nvml_abi::Return result, const std::string& call) const {
    if (result == nvml_abi::kSuccess) return Status::ok();
    const char* text = error_string != nullptr ? error_string(result) : nullptr;
    return {ErrorCode::kDriverError, call + " failed: NVML error " + std::to_string(result) +
                                         " (" + (text != nullptr ? text : "no description") + ")"};
  }
};

namespace {

constexpr const char* kLibrary = "libnvidia-ml.so.1";

template <typename Fn>
Status bind(void* library, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out != nullptr) return Status::ok();
  return {ErrorCode::kNotSupported,
          std::string(kLibrary) + " has no " + symbol + " (NVML too old for this driver ABI?)"};
}

std::string uuid_string(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace

std::unique_ptr<NvmlProcessMemory> NvmlProcessMemory::open(int cuda_device, Status* status) {
  std::unique_ptr<NvmlProcessMemory> nvml(new NvmlProcessMemory());
  nvml->library_ = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (nvml->library_ == nullptr) {
    const char* why = dlerror();
    *status = {ErrorCode::kNotSupported, std::string("NVML unavailable: dlopen(\"") + kLibrary +
                                             "\") failed: " + (why != nullptr ? why : "?")};
    return nullptr;
  }
  nvml->api_ = std::make_unique<Api>();
  Api& api = *nvml->api_;
  void* lib = nvml->library_;
  for (Status bound : {bind(lib, "nvmlInit_v2", &api.init), bind(lib, "nvmlShutdown", &api.shutdown),
                       bind(lib, "nvmlErrorString", &api.error_string),
                       bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", &api.handle_by_pci_bus_id),
                       bind(lib, "nvmlDeviceGetHandleByUUID", &api.handle_by_uuid),
                       bind(lib, "nvmlDeviceGetComputeRunningProcesses_v3",
                            &api.compute_processes),
                       bind(lib, "nvmlDeviceGetMemoryInfo", &api.memory_info)}) {
    if (!bound.is_ok()) {
      api.shutdown = nullptr;  // not initialised yet: the destructor must not shut down
      *status = std::move(bound);
      return nullptr;
    }
  }
  if (Status init = api.check(api.init(), "nvmlInit_v2"); !init.is_ok()) {
    api.shutdown = nullptr;
    *status = std::move(init);
    return nullptr;
  }

  // Match the CUDA device to the NVML device through the PCI bus id, else the UUID.
  char bus_id[64] = {};
  if (Status s = runtime_status(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device),
                                "cudaDeviceGetPCIBusId", "device=" + std::to_string(cuda_device));
      !s.is_ok()) {
    *status = std::move(s);
    return nullptr;
  }
  nvml->pci_bus_id_ = bus_id;
  nvml_abi::Device device = nullptr;
  Status by_bus = api.check(api.handle_by_pci_bus_id(bus_id, &device),
                            std::string("nvmlDeviceGetHandleByPciBusId_v2(\"") + bus_id + "\")");
  if (!by_bus.is_ok()) {
    cudaDeviceProp prop{};
    if (Status s = runtime_status(cudaGetDeviceProperties(&prop, cuda_device),
                                  "cudaGetDeviceProperties",
                                  "device=" + std::to_string(cuda_device));
        !s.is_ok()) {
      *status = {by_bus.code(), by_bus.message() + "; " + s.message()};
      return nullptr;
    }
    const std::string uuid = uuid_string(prop.uuid);
    Status by_uuid = api.check(api.handle_by_uuid(uuid.c_str(), &device),
                               "nvmlDeviceGetHandleByUUID(\"" + uuid + "\")");
    if (!by_uuid.is_ok()) {
      *status = {by_uuid.code(), "no NVML device matches CUDA device " +
                                     std::to_string(cuda_device) + ": " + by_bus.message() +
                                     "; " + by_uuid.message()};
      return nullptr;
    }
  }
  nvml->device_ = device;
  *status = Status::ok();
  return nvml;
}

NvmlProcessMemory::~NvmlProcessMemory() {
  if (api_ && api_->shutdown != nullptr) (void)api_->shutdown();
  if (library_ != nullptr) dlclose(library_);
}

Status NvmlProcessMemory::process_used_bytes(std::uint64_t* out) const {
  const auto device = static_cast<nvml_abi::Device>(device_);
  const unsigned int pid = static_cast<unsigned int>(getpid());
  std::vector<nvml_abi::ProcessInfo> infos(16);
  // The process list can grow between the calls; retry a few times with the size NVML wants.
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned int count = static_cast<unsigned int>(infos.size());
    const nvml_abi::Return result = api_->compute_processes(device, &count, infos.data());
    if (result == nvml_abi::kInsufficientSize) {
      infos.resize(static_cast<std::size_t>(count) + 16);
      continue;
    }
    if (Status s = api_->check(result, "nvmlDeviceGetComputeRunningProcesses_v3(" +
                                           pci_bus_id_ + ")");
        !s.is_ok()) {
      return s;
    }
    for (unsigned int i = 0; i < count; ++i) {
      if (infos[i].pid != pid) continue;
      if (infos[i].usedGpuMemory == nvml_abi::kValueNotAvailable) {
        return {ErrorCode::kNotSupported,
                "NVML lists pid " + std::to_string(pid) + " on " + pci_bus_id_ +
                    " but reports its used memory as not available"};
      }
      *out = infos[i].usedGpuMemory;
      return Status::ok();
    }
    return {ErrorCode::kInvalidArgument,
            "this process (pid " + std::to_string(pid) + ") is not among the " +
                std::to_string(count) + " compute processes NVML lists on " + pci_bus_id_ +
                " (no CUDA context yet, or NVML sees another PID namespace)"};
  }
  return {ErrorCode::kDriverError,
          "nvmlDeviceGetComputeRunningProcesses_v3: the process list kept growing"};
}

Status NvmlProcessMemory::device_memory(std::uint64_t* used_bytes,
                                        std::uint64_t* total_bytes) const {
  nvml_abi::Memory memory{};
  if (Status s = api_->check(api_->memory_info(static_cast<nvml_abi::Device>(device_), &memory),
                             "nvmlDeviceGetMemoryInfo(" + pci_bus_id_ + ")");
      !s.is_ok()) {
    return s;
  }
  *used_bytes = memory.used;
  *total_bytes = memory.total;
  return Status::ok();
}

Status nvml_process_used_bytes(int cuda_device, std::uint64_t* out) {
  Status status;
  const std::unique_ptr<NvmlProcessMemory> nvml = NvmlProcessMemory::open(cuda_device, &status);
  if (!nvml) return status;
  return nvml->process_used_bytes(out);
}

}  // namespace vramledger
