#include "torch_plugin/ipc_driver.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/device_guard.hpp"
#include "allocator/cuda/driver_api.hpp"
#include "allocator/text_format.hpp"
#include "torch_plugin/ipc_fd_server.hpp"

namespace vramledger::torch_plugin {

// ------------------------------------------------------------------ exports of kind 'v'

Status IpcDriver::export_pieces(int device, DevicePtr block,
                                std::span<const PhysicalPiece> pieces, VmmShare* share) {
  std::lock_guard<std::mutex> lock(exports_mutex_);
  share->pid = process_id();
  share->pieces.clear();
  const bool again = blocks_.count(block) != 0;  // sent before: the same descriptors
  std::vector<PhysicalHandle> created;
  for (const PhysicalPiece& piece : pieces) {
    auto it = chunks_.find(piece.handle);
    if (it == chunks_.end()) {
      int fd = -1;
      if (Status status = export_chunk(device, piece.handle, &fd); !status.is_ok()) {
        for (PhysicalHandle handle : created) {  // nothing exported by this call stays
          close_chunk(chunks_[handle].fd);
          chunks_.erase(handle);
        }
        return status;
      }
      it = chunks_.emplace(piece.handle, Chunk{fd, 0}).first;
      created.push_back(piece.handle);
    }
    share->pieces.push_back(
        VmmPiece{piece.va - pieces.front().va, piece.bytes, it->second.fd});
  }
  if (!again) {
    std::vector<PhysicalHandle>& handles = blocks_[block];
    for (const PhysicalPiece& piece : pieces) {
      ++chunks_[piece.handle].blocks;
      handles.push_back(piece.handle);
    }
    exported_blocks_.fetch_add(1, std::memory_order_relaxed);
  }
  return Status::ok();
}

void IpcDriver::release_block(DevicePtr block) noexcept {
  std::lock_guard<std::mutex> lock(exports_mutex_);
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return;
  for (PhysicalHandle handle : it->second) {
    auto chunk = chunks_.find(handle);
    if (chunk != chunks_.end() && --chunk->second.blocks == 0) {
      close_chunk(chunk->second.fd);
      chunks_.erase(chunk);
    }
  }
  blocks_.erase(it);
  exported_blocks_.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<DevicePtr> IpcDriver::exported_blocks() {
  std::lock_guard<std::mutex> lock(exports_mutex_);
  std::vector<DevicePtr> blocks;
  for (const auto& [block, handles] : blocks_) blocks.push_back(block);
  return blocks;
}

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes);

// Driver entry points outside DriverApi (which the VMM backend needs whole), resolved once.
template <typename Fn>
Fn driver_entry(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

struct IpcEntries {
  PFN_cuMemGetAddressRange_v3020 get_range =
      driver_entry<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
  PFN_cuMemExportToShareableHandle_v10020 export_handle =
      driver_entry<PFN_cuMemExportToShareableHandle_v10020>("cuMemExportToShareableHandle");
  PFN_cuMemImportFromShareableHandle_v10020 import_handle =
      driver_entry<PFN_cuMemImportFromShareableHandle_v10020>("cuMemImportFromShareableHandle");
};

const IpcEntries& entries() {
  static const IpcEntries resolved;
  return resolved;
}

Status missing(const char* symbol) {
  return {ErrorCode::kNotSupported,
          std::string("the CUDA driver does not provide ") + symbol + " (CUDA IPC)"};
}

class CudaIpcDriver final : public IpcDriver {
 public:
  Status export_allocation(int device, DevicePtr base, std::size_t bytes,
                           std::string* handle) override {
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    cudaIpcMemHandle_t raw{};
    Status status = check_runtime(
        cudaIpcGetMemHandle(&raw, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle", [&] {
          return "ptr=" + format_hex(base) + " bytes=" + std::to_string(bytes);
        });
    if (!status.is_ok()) return status;
    handle->assign(reinterpret_cast<const char*>(&raw), sizeof raw);
    return Status::ok();
  }

  Status open(int device, const IpcHandle& handle, DevicePtr* base,
              std::size_t* bytes) override {
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    if (handle.kind == IpcHandleKind::kVmmPages) return open_pages(device, handle, base, bytes);
    if (handle.payload.size() != sizeof(cudaIpcMemHandle_t)) {
      return {ErrorCode::kInvalidArgument, "a cudaIpcMemHandle_t has 64 bytes"};
    }
    cudaIpcMemHandle_t raw;
    std::memcpy(&raw, handle.payload.data(), sizeof raw);
    void* mapped = nullptr;
    Status status = check_runtime(
        cudaIpcOpenMemHandle(&mapped, raw, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle",
        [&] { return "device=" + std::to_string(device); });
    if (!status.is_ok()) return status;
    // The size of the whole allocation the handle names: cudaIpcOpenMemHandle does not say it.
    CUdeviceptr range_base = 0;
    std::size_t range_bytes = 0;
    status = entries().get_range == nullptr
                 ? missing("cuMemGetAddressRange")
                 : check_driver(entries().get_range(&range_base, &range_bytes,
                                                    reinterpret_cast<CUdeviceptr>(mapped)),
                                "cuMemGetAddressRange", [] { return std::string(); });
    if (!status.is_ok()) {
      (void)cudaIpcCloseMemHandle(mapped);
      (void)cudaGetLastError();
      return status;
    }
    *base = reinterpret_cast<DevicePtr>(mapped);
    *bytes = range_bytes;
    return Status::ok();
  }

  Status close(int device, DevicePtr base) override {
    DeviceGuard guard(device);
    if (!guard.status().is_ok()) return guard.status();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pages_.find(base);
      if (it != pages_.end()) {
        PagesMapping mapping = std::move(it->second);
        pages_.erase(it);
        return unmap_pages(base, mapping);
      }
    }
    return check_runtime(cudaIpcCloseMemHandle(reinterpret_cast<void*>(base)),
                         "cudaIpcCloseMemHandle", [&] { return "ptr=" + format_hex(base); });
  }

 protected:
  Status export_chunk(int /*device*/, PhysicalHandle handle, int* fd) override {
    if (entries().export_handle == nullptr) return missing("cuMemExportToShareableHandle");
    int exported = -1;
    Status status = check_driver(
        entries().export_handle(&exported, static_cast<CUmemGenericAllocationHandle>(handle),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle", [] {
          return std::string("POSIX file descriptor; the page was created without an export "
                             "handle type if the driver refused one (docs/ipc.md)");
        });
    if (!status.is_ok()) return status;
    status = offer_fd(exported);
    if (!status.is_ok()) {
      ::close(exported);
      return status;
    }
    *fd = exported;
    return Status::ok();
  }

  void close_chunk(int fd) noexcept override {
    withdraw_fd(fd);
    ::close(fd);
  }

  std::uint32_t process_id() const override { return static_cast<std::uint32_t>(::getpid()); }

 private:
  struct PagesMapping {
    std::size_t span = 0;
    std::vector<VmmPiece> pieces;
    std::vector<CUmemGenericAllocationHandle> handles;
  };

  Status open_pages(int device, const IpcHandle& handle, DevicePtr* base, std::size_t* bytes) {
    if (entries().import_handle == nullptr) return missing("cuMemImportFromShareableHandle");
    const DriverApi* api = nullptr;
    if (Status status = load_driver_api(&api); !status.is_ok()) return status;
    VmmShare share;
    try {
      share = decode_vmm_share(handle.payload);
    } catch (const Error& error) {
      return {error.code(), error.what()};
    }
    std::vector<int> wanted;
    for (const VmmPiece& piece : share.pieces) wanted.push_back(piece.fd);
    std::vector<int> fds;
    if (Status status = fetch_fds(share.pid, wanted, &fds); !status.is_ok()) return status;
    PagesMapping mapping;
    mapping.span = share.span_bytes();
    mapping.pieces = share.pieces;
    Status status;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      CUmemGenericAllocationHandle imported = 0;
      if (status.is_ok()) {
        void* os_handle = reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[i]));
        status = check_driver(
            entries().import_handle(&imported, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle", [&] { return "chunk " + std::to_string(i); });
        if (status.is_ok()) mapping.handles.push_back(imported);
      }
      ::close(fds[i]);  // the imported handle holds the memory now
    }
    CUdevice cu_device = 0;
    if (status.is_ok()) {
      status = check_driver(api->device_get(&cu_device, device), "cuDeviceGet",
                            [&] { return "device=" + std::to_string(device); });
    }
    CUdeviceptr va = 0;
    if (status.is_ok()) {
      status = check_driver(api->mem_address_reserve(&va, mapping.span, 0, 0, 0),
                            "cuMemAddressReserve",
                            [&] { return "bytes=" + std::to_string(mapping.span); });
      if (!status.is_ok()) va = 0;
    }
    std::size_t mapped = 0;
    for (; status.is_ok() && mapped < mapping.handles.size(); ++mapped) {
      const VmmPiece& piece = mapping.pieces[mapped];
      status = check_driver(api->mem_map(va + piece.offset, piece.bytes, 0,
                                         mapping.handles[mapped], 0),
                            "cuMemMap", [&] { return "chunk " + std::to_string(mapped); });
      if (!status.is_ok()) break;
    }
    if (status.is_ok()) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = cu_device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      status = check_driver(api->mem_set_access(va, mapping.span, &access, 1), "cuMemSetAccess",
                            [&] { return "bytes=" + std::to_string(mapping.span); });
    }
    if (!status.is_ok()) {  // undo in reverse; the first failure is the one reported
      for (std::size_t i = 0; i < mapped; ++i) {
        (void)api->mem_unmap(va + mapping.pieces[i].offset, mapping.pieces[i].bytes);
      }
      if (va != 0) (void)api->mem_address_free(va, mapping.span);
      for (CUmemGenericAllocationHandle imported : mapping.handles) {
        (void)api->mem_release(imported);
      }
      return status;
    }
    *base = static_cast<DevicePtr>(va);
    *bytes = mapping.span;
    std::lock_guard<std::mutex> lock(mutex_);
    pages_.emplace(*base, std::move(mapping));
    return Status::ok();
  }

  static Status unmap_pages(DevicePtr base, const PagesMapping& mapping) {
    const DriverApi* api = nullptr;
    if (Status status = load_driver_api(&api); !status.is_ok()) return status;
    Status first;
    auto keep = [&first](Status status) {
      if (first.is_ok() && !status.is_ok()) first = std::move(status);
    };
    for (const VmmPiece& piece : mapping.pieces) {
      keep(check_driver(api->mem_unmap(base + piece.offset, piece.bytes), "cuMemUnmap",
                        [&] { return format_hex(base + piece.offset); }));
    }
    keep(check_driver(api->mem_address_free(base, mapping.span), "cuMemAddressFree",
                      [&] { return format_hex(base); }));
    for (CUmemGenericAllocationHandle imported : mapping.handles) {
      keep(check_driver(api->mem_release(imported), "cuMemRelease", [] { return std::string(); }));
    }
    return first;
  }

  std::mutex mutex_;
  std::map<DevicePtr, PagesMapping> pages_;  // kind 'v' mappings by address
};

// Kind 'c' handles are 64 bytes: a magic word, then base and size of the exported range. Kind 'v'
// descriptors are made-up numbers. Opening either maps nothing, at a fresh fake address.
class SimulatedIpcDriver final : public IpcDriver {
 public:
  Status export_allocation(int /*device*/, DevicePtr base, std::size_t bytes,
                           std::string* handle) override {
    handle->assign(kCudaIpcHandleBytes, '\0');
    std::memcpy(handle->data(), kMagic, sizeof kMagic);
    std::memcpy(handle->data() + 8, &base, sizeof base);
    std::memcpy(handle->data() + 16, &bytes, sizeof bytes);
    return Status::ok();
  }

  Status open(int /*device*/, const IpcHandle& handle, DevicePtr* base,
              std::size_t* bytes) override {
    std::size_t size = 0;
    if (handle.kind == IpcHandleKind::kVmmPages) {
      try {
        const VmmShare share = decode_vmm_share(handle.payload);
        std::lock_guard<std::mutex> lock(mutex_);
        for (const VmmPiece& piece : share.pieces) {
          if (fds_.count(piece.fd) == 0) {
            return {ErrorCode::kInvalidArgument,
                    "simulated CUDA IPC: descriptor " + std::to_string(piece.fd) +
                        " is not offered (its memory was freed)"};
          }
        }
        size = share.span_bytes();
      } catch (const Error& error) {
        return {error.code(), error.what()};
      }
    } else {
      if (handle.payload.size() != kCudaIpcHandleBytes ||
          std::memcmp(handle.payload.data(), kMagic, sizeof kMagic) != 0) {
        return {ErrorCode::kInvalidArgument,
                "not a handle of the simulated device (cudaIpcOpenMemHandle would fail too)"};
      }
      std::memcpy(&size, handle.payload.data() + 16, sizeof size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    *base = next_;
    *bytes = size;
    // Fake addresses far above the simulated device's, never reused.
    next_ += (size + (DevicePtr{2} << 20)) & ~((DevicePtr{2} << 20) - 1);
    open_.emplace(*base, size);
    return Status::ok();
  }

  Status close(int /*device*/, DevicePtr base) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_.erase(base) == 0) {
      return {ErrorCode::kInvalidPointer,
              "simulated CUDA IPC: " + format_hex(base) + " is not an open mapping"};
    }
    return Status::ok();
  }

 protected:
  Status export_chunk(int /*device*/, PhysicalHandle /*handle*/, int* fd) override {
    std::lock_guard<std::mutex> lock(mutex_);
    *fd = next_fd_++;
    fds_.insert(*fd);
    return Status::ok();
  }
  void close_chunk(int fd) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    fds_.erase(fd);
  }
  std::uint32_t process_id() const override { return 1; }

 private:
  static constexpr char kMagic[8] = {'v', 'l', 's', 'i', 'm', 'i', 'p', 'c'};
  std::mutex mutex_;
  DevicePtr next_ = DevicePtr{0x7e00} << 32;
  std::map<DevicePtr, std::size_t> open_;
  int next_fd_ = 1000;
  std::set<int> fds_;
};

}  // namespace

std::unique_ptr<IpcDriver> make_cuda_ipc_driver() { return std::make_unique<CudaIpcDriver>(); }
std::unique_ptr<IpcDriver> make_simulated_ipc_driver() {
  return std::make_unique<SimulatedIpcDriver>();
}

}  // namespace vramledger::torch_plugin
