// What CUDA IPC asks of the driver, behind an interface so the bookkeeping above it
// (ipc_imports.hpp, the plugin's shareIpcHandle / getIpcDevPtr) runs on the simulated device in
// CI (docs/ipc.md):
//   kind 'c'  a cudaMalloc allocation exported as a cudaIpcMemHandle_t, mapped with
//             cudaIpcOpenMemHandle;
//   kind 'v'  the paged heap's physical chunks under a block, each exported once as a POSIX file
//             descriptor (kept, and offered to importers, until the last exported block on the
//             chunk is freed), imported and mapped side by side in a reserved range.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "torch_plugin/ipc_handle.hpp"

namespace vramledger::torch_plugin {

class IpcDriver {
 public:
  virtual ~IpcDriver() = default;
  // Kind 'c': the 64-byte handle of the driver allocation of `bytes` at `base` on `device`.
  virtual Status export_allocation(int device, DevicePtr base, std::size_t bytes,
                                   std::string* handle) = 0;
  // Kind 'v': the share of the chunks under the block at `block` (pieces from
  // CachingAllocator::physical_pieces, in address order and contiguous).
  Status export_pieces(int device, DevicePtr block, std::span<const PhysicalPiece> pieces,
                       VmmShare* share);
  // The block at `block` is being freed: descriptors no other exported block uses are closed.
  void release_block(DevicePtr block) noexcept;
  // Whether any block is exported (a free checks this first, without a lock).
  bool has_exports() const noexcept { return exported_blocks_.load(std::memory_order_relaxed) > 0; }
  // The addresses of the blocks exported as kind 'v' and not yet freed.
  std::vector<DevicePtr> exported_blocks();

  // Maps what `handle` names on `device` (either kind): its address here and its size. A handle
  // may be mapped once per process: the caller keeps one mapping per handle.
  virtual Status open(int device, const IpcHandle& handle, DevicePtr* base,
                      std::size_t* bytes) = 0;
  virtual Status close(int device, DevicePtr base) = 0;

 protected:
  // A new descriptor for the physical chunk `handle` (kind 'v'), offered to importers.
  virtual Status export_chunk(int device, PhysicalHandle handle, int* fd) = 0;
  virtual void close_chunk(int fd) noexcept = 0;
  virtual std::uint32_t process_id() const = 0;

 private:
  struct Chunk {
    int fd = -1;
    std::size_t blocks = 0;  // exported blocks on it
  };
  std::mutex exports_mutex_;
  std::map<PhysicalHandle, Chunk> chunks_;
  std::map<DevicePtr, std::vector<PhysicalHandle>> blocks_;
  std::atomic<std::size_t> exported_blocks_{0};
};

// The CUDA runtime and driver; descriptors travel through ipc_fd_server.
std::unique_ptr<IpcDriver> make_cuda_ipc_driver();

// The simulated device (backend:simulated, tests): a handle names its memory in this process,
// and opening it maps it at a fresh fake address, as another process would see it.
std::unique_ptr<IpcDriver> make_simulated_ipc_driver();

}  // namespace vramledger::torch_plugin
