#include "allocator/simulated/simulated_contents.hpp"

#include <algorithm>
#include <cstring>

namespace vramledger {

void SimulatedContents::write(const std::vector<SimulatedMemory::MemoryPiece>& pieces,
                              const void* data) {
  const auto* in = static_cast<const std::uint8_t*>(data);
  for (const SimulatedMemory::MemoryPiece& piece : pieces) {
    std::vector<std::uint8_t>& stored = bytes_[piece.owner];
    if (stored.size() < piece.end) stored.resize(piece.end, 0);
    std::memcpy(stored.data() + piece.begin, in, piece.end - piece.begin);
    in += piece.end - piece.begin;
  }
}

void SimulatedContents::read(const std::vector<SimulatedMemory::MemoryPiece>& pieces,
                             void* out) const {
  auto* to = static_cast<std::uint8_t*>(out);
  for (const SimulatedMemory::MemoryPiece& piece : pieces) {
    const std::size_t length = piece.end - piece.begin;
    std::memset(to, 0, length);
    if (auto it = bytes_.find(piece.owner); it != bytes_.end() && it->second.size() > piece.begin) {
      const std::size_t stored = std::min(length, it->second.size() - piece.begin);
      std::memcpy(to, it->second.data() + piece.begin, stored);
    }
    to += length;
  }
}

std::size_t SimulatedContents::stored_bytes() const {
  std::size_t total = 0;
  for (const auto& [owner, stored] : bytes_) total += stored.size();
  return total;
}

}  // namespace vramledger
