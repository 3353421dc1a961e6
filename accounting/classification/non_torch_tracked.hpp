// Device memory this process allocated outside torch's allocator, counted by an interposer (the
// future LD_PRELOAD shim: cuMemAlloc*, cudaMalloc*, cuMemCreate, ... from NCCL, cuBLAS
// workspaces, Triton, raw user code), by library.
//
// `hooked` distinguishes "nothing is tracking" from "tracking, and these libraries allocated
// this much" (possibly nothing). Without a tracker, non-torch memory is not a line of its own:
// it is inside the classification's remainder, which is then named accordingly
// (docs/classification.md, "Non-torch memory").
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace vramledger {

struct NonTorchTracked {
  bool hooked = false;
  std::map<std::string, std::int64_t> bytes_by_library;  // live bytes per library (soname)

  std::int64_t total() const noexcept {
    std::int64_t sum = 0;
    for (const auto& [library, bytes] : bytes_by_library) sum += bytes;
    return sum;
  }
  static NonTorchTracked untracked() { return {}; }
};

class NonTorchTracker {
 public:
  virtual ~NonTorchTracker() = default;
  virtual NonTorchTracked sample() = 0;
};

}  // namespace vramledger
