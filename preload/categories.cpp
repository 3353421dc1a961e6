#include "preload/categories.hpp"

#include <cstring>

namespace vramledger::preload {
namespace {

// The file name part of a path ("/a/b/libnccl.so.2" -> "libnccl.so.2").
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

}  // namespace

Category classify_object_path(const char* path) {
  if (path == nullptr) return VRAMLEDGER_PRELOAD_JIT;
  const char* name = base_name(path);
  // Order matters only where names could overlap; none of these prefixes do.
  if (starts_with(name, "libvramledger")) return VRAMLEDGER_PRELOAD_VRAMLEDGER;
  if (starts_with(name, "libnccl")) return VRAMLEDGER_PRELOAD_NCCL;
  if (starts_with(name, "libcublas")) return VRAMLEDGER_PRELOAD_CUBLAS;  // cuBLAS and cuBLASLt
  if (starts_with(name, "libcudnn")) return VRAMLEDGER_PRELOAD_CUDNN;
  if (starts_with(name, "libc10_cuda") || starts_with(name, "libtorch_cuda")) {
    return VRAMLEDGER_PRELOAD_TORCH;
  }
  // libcudart's own code calling the driver: the real caller is one frame further, which
  // cannot be read safely without frame pointers.
  if (starts_with(name, "libcudart")) return VRAMLEDGER_PRELOAD_UNKNOWN;
  // Triton's compiled launchers live in its cache (~/.triton/cache/...) or the package.
  if (std::strstr(path, "/triton/") != nullptr || std::strstr(path, "/.triton/") != nullptr) {
    return VRAMLEDGER_PRELOAD_TRITON;
  }
  return VRAMLEDGER_PRELOAD_USER;
}

const char* category_name(int category) {
  static const char* const kNames[kCategoryCount] = {
      "nccl", "cublas", "cudnn", "triton", "unknown/JIT", "torch", "vramledger", "user", "unknown",
      "routed cache (idle)"};
  if (category < 0 || category >= kCategoryCount) return nullptr;
  return kNames[category];
}

}  // namespace vramledger::preload
