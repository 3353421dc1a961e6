// What the policy remembers about sleeping tags (detail/sleep.cpp, docs/sleep.md): the blocks
// of each tag put to sleep, where their contents wait on the host (offloaded tags), and the
// bytes of each block that stay on pages kept mapped for neighbours (resident).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/detail/block.hpp"

namespace vramledger {

struct SleepingBlock {
  Block* block = nullptr;
  std::size_t host_offset = SIZE_MAX;  // into its tag's host copy; SIZE_MAX: discarded
  std::size_t resident = 0;            // bytes on pages kept mapped, as announced to the ledger
};

// Host memory for offloaded contents, kept after a wake for the next sleep (pinning gigabytes
// costs about as much as copying them).
struct HostBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
};

struct SleepingTag {
  std::vector<SleepingBlock> blocks;
  HostBuffer host;  // offloaded tags only
};

}  // namespace vramledger
