#include "torch_plugin/ipc_handle.hpp"

#include <cstring>

#include "allocator/errors.hpp"

namespace vramledger::torch_plugin {
namespace {

// Kind 'v' layout (host byte order: both processes are on one machine): pid (4), piece count
// (4), then per piece offset (8), bytes (8), fd (4), 4 bytes of padding.
constexpr std::size_t kVmmHeaderBytes = 8;
constexpr std::size_t kVmmPieceBytes = 24;

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <typename T>
T get(std::string_view in, std::size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

void check_pieces(const VmmShare& share) {
  if (share.pieces.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "a VMM share without physical chunks");
  }
  std::uint64_t next = 0;
  for (const VmmPiece& piece : share.pieces) {
    if (piece.offset != next || piece.bytes == 0 || piece.fd < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "a VMM share's chunks must follow each other from offset 0 with a size and a "
                  "file descriptor (chunk at " + std::to_string(piece.offset) + ", expected " +
                      std::to_string(next) + ")");
    }
    next = piece.offset + piece.bytes;
  }
}

}  // namespace

std::string encode_vmm_share(const VmmShare& share) {
  check_pieces(share);
  std::string wire;
  wire += kIpcHandleVersion;
  wire += static_cast<char>(IpcHandleKind::kVmmPages);
  put(wire, share.pid);
  put(wire, static_cast<std::uint32_t>(share.pieces.size()));
  for (const VmmPiece& piece : share.pieces) {
    put(wire, piece.offset);
    put(wire, piece.bytes);
    put(wire, piece.fd);
    put(wire, std::uint32_t{0});
  }
  return wire;
}

VmmShare decode_vmm_share(std::string_view payload) {
  if (payload.size() < kVmmHeaderBytes) {
    throw Error(ErrorCode::kInvalidArgument, "a VMM share of " + std::to_string(payload.size()) +
                                                 " bytes: shorter than its header");
  }
  VmmShare share;
  share.pid = get<std::uint32_t>(payload, 0);
  const auto count = get<std::uint32_t>(payload, 4);
  if (payload.size() != kVmmHeaderBytes + std::size_t{count} * kVmmPieceBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "a VMM share of " + std::to_string(payload.size()) + " bytes cannot hold " +
                    std::to_string(count) + " chunks");
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t at = kVmmHeaderBytes + std::size_t{i} * kVmmPieceBytes;
    share.pieces.push_back(VmmPiece{get<std::uint64_t>(payload, at),
                                    get<std::uint64_t>(payload, at + 8),
                                    get<std::int32_t>(payload, at + 16)});
  }
  check_pieces(share);
  return share;
}

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
  if (kind == static_cast<char>(IpcHandleKind::kVmmPages)) {
    decode_vmm_share(payload);  // throws when malformed
    return {IpcHandleKind::kVmmPages, std::string(payload)};
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
                  " (known: 'c' cudaMalloc, 'v' vramledger pages, 'e' expandable segment)");
}

}  // namespace vramledger::torch_plugin
