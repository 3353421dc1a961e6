#include "allocator/detail/free_block_index.hpp"

#include "allocator/detail/address_range.hpp"

namespace vramledger {

namespace {
// How many blocks of the request's own bin are inspected before moving to larger bins; bounds
// the search when a bin holds many blocks just below the request.
constexpr int kOwnBinScanLimit = 16;
}  // namespace

void FreeBlockIndex::insert(Block* block) {
  const std::uint32_t bin = size_bins::bin_of(block->size);
  block->free_bin = bin;
  block->free_seq = changes_;
  block->free_prev = nullptr;
  block->free_next = bins_[bin];
  if (bins_[bin] != nullptr) bins_[bin]->free_prev = block;
  bins_[bin] = block;
  occupied_.set(bin);
  ++count_;
  ++changes_;
  if (mapped_runs_.enabled() && block->range->is_span) mapped_runs_.on_insert(block);
}

void FreeBlockIndex::remove(Block* block) {
  const std::uint32_t bin = block->free_bin;
  if (block->free_prev != nullptr) {
    block->free_prev->free_next = block->free_next;
  } else {
    bins_[bin] = block->free_next;
  }
  if (block->free_next != nullptr) block->free_next->free_prev = block->free_prev;
  block->free_prev = block->free_next = nullptr;
  if (bins_[bin] == nullptr) occupied_.clear(bin);
  --count_;
  ++changes_;
  if (MappedRunIndex::tracks(*block)) mapped_runs_.on_remove(block);
}

Block* FreeBlockIndex::find(std::size_t size) const {
  const std::uint32_t own_bin = size_bins::bin_of(size);
  // Blocks in the request's own bin may be smaller than the request: pick the smallest that fits
  // among the first few.
  Block* best = nullptr;
  int inspected = 0;
  for (Block* b = bins_[own_bin]; b != nullptr && inspected < kOwnBinScanLimit;
       b = b->free_next, ++inspected) {
    if (b->size >= size && (best == nullptr || b->size < best->size)) {
      best = b;
      if (b->size == size) break;
    }
  }
  if (best != nullptr) return best;
  // Every block in a later bin is larger than the request.
  const std::uint32_t bin = occupied_.first_at_or_above(own_bin + 1);
  return bin < size_bins::kBins ? bins_[bin] : nullptr;
}

}  // namespace vramledger
