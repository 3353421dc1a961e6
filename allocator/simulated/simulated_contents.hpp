// The bytes the simulated device holds, so that tests can check what survives a sleep and wake
// (docs/sleep.md): stored per piece of memory (a physical handle, or a segment by its base) and
// reached through SimulatedMemory::memory_behind, so an alias reads what the other address wrote.
// Untouched bytes read as zero; memory released to the driver forgets its bytes, as real memory
// given back and created again would not keep them. Storage grows only as far as it is written.
// Not synchronised: SimulatedDevice calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "allocator/simulated/simulated_memory.hpp"

namespace vramledger {

class SimulatedContents {
 public:
  void write(const std::vector<SimulatedMemory::MemoryPiece>& pieces, const void* data);
  void read(const std::vector<SimulatedMemory::MemoryPiece>& pieces, void* out) const;
  void forget(std::uint64_t owner) { bytes_.erase(owner); }
  std::size_t stored_bytes() const;

 private:
  std::unordered_map<std::uint64_t, std::vector<std::uint8_t>> bytes_;
};

}  // namespace vramledger
