#include "torch_plugin/cuda_ipc.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

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

void release_ipc_export(void* ptr) noexcept {
  IpcDriver& driver = ipc_driver();
  if (driver.has_exports()) driver.release_block(reinterpret_cast<DevicePtr>(ptr));
}

std::vector<DevicePtr> ipc_exported_blocks() { return ipc_driver().exported_blocks(); }

c10_alloc::ShareableHandle VramledgerAllocator::shareIpcHandle(void* ptr) {
  const std::optional<LiveAllocation> found = registry_.find(ptr);
  TORCH_CHECK(found.has_value(), "vramledger: cannot share ", ptr,
              " with another process (CUDA IPC): it is not the start of a live vramledger "
              "allocation");
  DeviceAllocators& state = device_state(static_cast<c10::DeviceIndex>(found->device));
  const auto address = reinterpret_cast<DevicePtr>(ptr);
  DevicePtr base = address;
  std::size_t bytes = found->requested;
  if (found->pool != nullptr) {  // else: caching disabled, its own cudaMalloc allocation
    const bool default_pool = found->pool == &state.default_pool();
    TORCH_CHECK(!default_pool || state.backend_info().name != "malloc_async",
                "vramledger: sharing CUDA tensors between processes (CUDA IPC) is not "
                "supported on the malloc_async backend: memory of a cudaMallocAsync pool has no "
                "cudaIpcMemHandle (cudaIpcGetMemHandle refuses it). Use backend:cuda_malloc or "
                "backend:vmm for processes that send CUDA tensors (docs/ipc.md)");
    try {
      const std::vector<PhysicalPiece> pieces =
          default_pool && state.default_pool_is_paged()
              ? found->pool->policy().physical_pieces(address)
              : std::vector<PhysicalPiece>{};
      if (!pieces.empty()) {
        // Kind 'v': the physical chunks under the block, each as a file descriptor.
        VmmShare share;
        const Status status = ipc_driver().export_pieces(found->device, address, pieces, &share);
        if (!status.is_ok()) throw Error(status.code(), status.message());
        return c10_alloc::ShareableHandle{
            static_cast<std::ptrdiff_t>(address - pieces.front().va), encode_vmm_share(share)};
      }
      const AllocationInfo info = found->pool->policy().describe(address);
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
  return c10_alloc::ShareableHandle{static_cast<std::ptrdiff_t>(address - base),
                                    encode_cuda_malloc_handle(raw)};
}

std::shared_ptr<void> VramledgerAllocator::getIpcDevPtr(std::string handle) {
  try {
    const IpcHandle decoded = decode_ipc_handle(handle);
    // torch makes the storage's device current before it calls us (rebuild_cuda_tensor).
    const int device = simulated_process() ? 0 : static_cast<int>(c10::cuda::current_device());
    return imported_memory().open(device, decoded);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "vramledger: cannot open a CUDA tensor sent by another process (CUDA "
                       "IPC): ", error.what());
  }
}

}  // namespace vramledger::torch_plugin
