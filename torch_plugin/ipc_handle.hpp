// The bytes of a CUDA IPC handle as torch carries them between processes: storage._share_cuda_()
// puts what CUDAAllocator::shareIpcHandle returns into the pickle (torch/multiprocessing/
// reductions.py) and rebuild_cuda_tensor hands the same bytes to getIpcDevPtr in the receiver.
//
// The layout is PyTorch's own (c10/cuda/CUDACachingAllocator.cpp, torch 2.11 to 2.15): a version
// byte (2), a kind byte, then the kind's payload; a bare 64-byte cudaIpcMemHandle_t is what
// releases before the version byte sent. Keeping it means a tensor sent from a process on torch's
// native allocator opens in one on vramledger, and the other way round, for the cudaMalloc kind.
// (docs/ipc.md)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vramledger::torch_plugin {

inline constexpr char kIpcHandleVersion = 2;
inline constexpr std::size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

enum class IpcHandleKind : char {
  kCudaMalloc = 'c',         // payload: cudaIpcMemHandle_t of a whole cudaMalloc allocation
  kExpandableSegment = 'e',  // torch's expandable segments (POSIX fds); vramledger cannot open it
  kVmmPages = 'v',           // vramledger's paged heap: VmmShare below (vramledger processes only)
};

// Kind 'v': the physical chunks under a block of the paged heap, each mapped whole in the
// exporter at `offset` from the first one, and the exporter's file descriptor for it
// (cuMemExportToShareableHandle), which the importer fetches from process `pid` (ipc_fd_server).
struct VmmPiece {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::int32_t fd = -1;
  friend bool operator==(const VmmPiece&, const VmmPiece&) = default;
};
struct VmmShare {
  std::uint32_t pid = 0;
  std::vector<VmmPiece> pieces;  // offsets ascending, the first at 0, no overlap
  std::uint64_t span_bytes() const {
    return pieces.empty() ? 0 : pieces.back().offset + pieces.back().bytes;
  }
  friend bool operator==(const VmmShare&, const VmmShare&) = default;
};

struct IpcHandle {
  IpcHandleKind kind = IpcHandleKind::kCudaMalloc;
  std::string payload;
};

// Version, kind 'c', the 64 bytes. Throws Error(kInvalidArgument) for a payload of another size.
std::string encode_cuda_malloc_handle(std::string_view cuda_ipc_handle);

// Version, kind 'v', the share. Throws Error(kInvalidArgument) for an empty or malformed one.
std::string encode_vmm_share(const VmmShare& share);
// The payload of a kind 'v' handle. Throws Error(kInvalidArgument) naming what is wrong.
VmmShare decode_vmm_share(std::string_view payload);

// Throws Error(kInvalidArgument) naming what is wrong: empty, a newer version, an unknown kind,
// a payload of the wrong length; Error(kNotSupported) for the expandable-segment kind.
IpcHandle decode_ipc_handle(std::string_view wire);

}  // namespace vramledger::torch_plugin
