#include "torch_plugin/ipc_handle.hpp"

#include "allocator/errors.hpp"

namespace vramledger::torch_plugin {

std::string encode_cuda_malloc_handle(std::string_view cuda_ipc_handle) {
  if (cuda_ipc_handle.size() != kCudaIpcHandleBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "a cudaIpcMemHandle_t has " + std::to_string(kCudaIpcHandleBytes) +
                    " bytes, not " + std::to_string(cuda_ipc_handle.size()));
  }
  std::string wire;
  wire.reserve(2 + kCudaIpcHandleBytes);
  wire += kIpcHandleVersion;
  wire += static_cast<char>(IpcHandleKind::kCudaMalloc);
  wire += cuda_ipc_handle;
  return wire;
}

IpcHandle decode_ipc_handle(std::string_view wire) {
  if (wire.size() == kCudaIpcHandleBytes) {  // before the version byte: always cudaMalloc
    return {IpcHandleKind::kCudaMalloc, std::string(wire)};
  }
  if (wire.size() < 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "CUDA IPC handle of " + std::to_string(wire.size()) +
                    " bytes: too short to be one (a version and a kind byte come first)");
  }
  const auto version = static_cast<unsigned char>(wire[0]);
  if (version > static_cast<unsigned char>(kIpcHandleVersion)) {
    throw Error(ErrorCode::kInvalidArgument,
                "CUDA IPC handle of version " + std::to_string(version) +
                    ": sent by a newer torch than this process understands (version " +
                    std::to_string(kIpcHandleVersion) + ")");
  }
  const char kind = wire[1];
  const std::string_view payload = wire.substr(2);
  if (kind == static_cast<char>(IpcHandleKind::kCudaMalloc)) {
    if (payload.size() != kCudaIpcHandleBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  "CUDA IPC handle of kind 'c' carries " + std::to_string(payload.size()) +
                      " bytes; a cudaIpcMemHandle_t has " + std::to_string(kCudaIpcHandleBytes));
    }
    return {IpcHandleKind::kCudaMalloc, std::string(payload)};
  }
  if (kind == static_cast<char>(IpcHandleKind::kExpandableSegment)) {
    throw Error(ErrorCode::kNotSupported,
                "this CUDA tensor comes from a process whose allocator is torch's native one "
                "with expandable_segments:True (handle kind 'e', POSIX file descriptors); "
                "vramledger opens only cudaMalloc handles (kind 'c'): send it from a process "
                "without expandable segments, or from one on vramledger's cuda_malloc backend");
  }
  throw Error(ErrorCode::kInvalidArgument,
              "CUDA IPC handle of unknown kind " + std::to_string(static_cast<int>(kind)) +
                  " (known: 'c' cudaMalloc, 'e' expandable segment)");
}

}  // namespace vramledger::torch_plugin
