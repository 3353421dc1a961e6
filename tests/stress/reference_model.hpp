// The stress tests' independent model of what the allocator should hold: every live block with
// the size it was asked for. Kept by address so that overlap with the neighbours of a new block
// is an O(log n) check, and so that it can be compared with the allocator's own segment walk.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.hpp"

namespace vramledger::stress {

struct LiveBlock {
  std::size_t requested = 0;
  std::size_t size = 0;  // allocated size, as the allocator described it at allocation
  StreamHandle stream = 0;
  TagId tag = kUntagged;
};

class ReferenceModel {
 public:
  // Adds a block the allocator just handed out. Returns a description of the problem when it
  // overlaps a live block (the allocator handed out memory twice); the model is unchanged then.
  std::optional<std::string> insert(DevicePtr address, const LiveBlock& block);
  // Removes a block; false when it is not live in the model.
  bool erase(DevicePtr address);

  const std::map<DevicePtr, LiveBlock>& blocks() const { return blocks_; }
  std::size_t size() const { return blocks_.size(); }
  bool empty() const { return blocks_.empty(); }
  std::size_t allocated_bytes() const { return allocated_bytes_; }
  // The live block at position `index` in address order (O(n); the tests pick at random).
  DevicePtr nth(std::size_t index) const;

  // Compares the model with the allocator's full segment walk: the same allocated blocks at the
  // same addresses with the same sizes, requested sizes and tags; blocks tile each range; ranges
  // do not overlap. Returns the first difference found.
  std::optional<std::string> compare_with(const std::vector<SegmentInfo>& segments) const;

 private:
  std::map<DevicePtr, LiveBlock> blocks_;
  std::size_t allocated_bytes_ = 0;
};

}  // namespace vramledger::stress
