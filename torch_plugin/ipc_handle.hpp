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
#include <string>
#include <string_view>

namespace vramledger::torch_plugin {

inline constexpr char kIpcHandleVersion = 2;
inline constexpr std::size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

enum class IpcHandleKind : char {
  kCudaMalloc = 'c',         // payload: cudaIpcMemHandle_t of a whole cudaMalloc allocation
  kExpandableSegment = 'e',  // torch's expandable segments (POSIX fds); vramledger cannot open it
};

struct IpcHandle {
  IpcHandleKind kind = IpcHandleKind::kCudaMalloc;
  std::string payload;
};

// Version, kind 'c', the 64 bytes. Throws Error(kInvalidArgument) for a payload of another size.
std::string encode_cuda_malloc_handle(std::string_view cuda_ipc_handle);

// Throws Error(kInvalidArgument) naming what is wrong: empty, a newer version, an unknown kind,
// a payload of the wrong length; Error(kNotSupported) for the expandable-segment kind.
IpcHandle decode_ipc_handle(std::string_view wire);

}  // namespace vramledger::torch_plugin
