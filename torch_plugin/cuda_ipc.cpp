#include "torch_plugin/cuda_ipc.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <optional>

#include "allocator/text_format.hpp"
#include "torch_plugin/ipc_handle.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {
namespace {

bool simulated_process() {
  const VramledgerAllocator* instance = VramledgerAllocator::instance();
  return instance != nullptr && instance->config().backend == "simulated";
}

IpcDriver& ipc_driver() {
  static IpcDriver* driver =
      (simulated_process() ? make_simulated_ipc_driver() : make_cuda_ipc_driver()).release();
  return *driver;
}

}  // namespace

ImportedMemory& imported_memory() {
  static auto* imports = new ImportedMemory(ipc_driver());
  return *imports;
}

c10_alloc::ShareableHandle VramledgerAllocator::shareIpcHandle(void* ptr) {
  const std::optional<LiveAllocation> found = registry_.find(ptr);
  TORCH_CHECK(found.has_value(), "vramledger: cannot share ", ptr,
              " with another process (CUDA IPC): it is not the start of a live vramledger "
              "allocation");
  DeviceAllocators& state = device_state(static_cast<c10::DeviceIndex>(found->device));
  DevicePtr base = reinterpret_cast<DevicePtr>(ptr);
  std::size_t bytes = found->requested;
  if (found->pool != nullptr) {  // else: caching disabled, its own cudaMalloc allocation
    if (found->pool == &state.default_pool()) {
      TORCH_CHECK(!state.default_pool_is_paged(),
                  "vramledger: sharing CUDA tensors between processes (CUDA IPC) is not built "
                  "for the VMM backend yet: its blocks lie on physical pages that need POSIX "
                  "file-descriptor handles (docs/ipc.md). Run the processes that send CUDA "
                  "tensors with VRAMLEDGER_CONF=backend:cuda_malloc, or "
                  "allocate the shared tensors in a torch.cuda.MemPool (its pool uses cudaMalloc "
                  "segments)");
      TORCH_CHECK(state.backend_info().name != "malloc_async",
                  "vramledger: sharing CUDA tensors between processes (CUDA IPC) is not "
                  "supported on the malloc_async backend: memory of a cudaMallocAsync pool has no "
                  "cudaIpcMemHandle (cudaIpcGetMemHandle refuses it). Use backend:cuda_malloc for "
                  "processes that send CUDA tensors (docs/ipc.md)");
    }
    try {
      const AllocationInfo info = found->pool->policy().describe(base);
      base = info.segment_base;
      bytes = info.segment_size;
    } catch (const std::exception& error) {
      TORCH_CHECK(false, "vramledger: CUDA IPC export of ", ptr, ": ", error.what());
    }
  }
  std::string raw;
  const Status status = ipc_driver().export_allocation(found->device, base, bytes, &raw);
  TORCH_CHECK(status.is_ok(), "vramledger: CUDA IPC export of ", ptr, " (its segment at ",
              format_hex(base), ", ", bytes, " bytes) failed: ", status.message());
  return c10_alloc::ShareableHandle{
      static_cast<std::ptrdiff_t>(reinterpret_cast<DevicePtr>(ptr) - base),
      encode_cuda_malloc_handle(raw)};
}

std::shared_ptr<void> VramledgerAllocator::getIpcDevPtr(std::string handle) {
  try {
    const IpcHandle decoded = decode_ipc_handle(handle);
    // torch makes the storage's device current before it calls us (rebuild_cuda_tensor).
    const int device = simulated_process() ? 0 : static_cast<int>(c10::cuda::current_device());
    return imported_memory().open(device, decoded.payload);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "vramledger: cannot open a CUDA tensor sent by another process (CUDA "
                       "IPC): ", error.what());
  }
}

}  // namespace vramledger::torch_plugin
