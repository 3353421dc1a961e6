#include "allocator/detail/free_block_index.hpp"

namespace vramledger {

namespace {
// How many blocks of the request's own class are inspected before moving to larger classes;
// bounds the search when a class holds many blocks just below the request.
constexpr int kOwnClassScanLimit = 16;
}  // namespace

std::uint32_t FreeBlockIndex::bin_of(std::size_t size) {
  if (size < kSubclasses) return static_cast<std::uint32_t>(size);
  const int msb = std::bit_width(size) - 1;
  const int cls = msb - kSubclassBits + 1;
  const auto sub = static_cast<std::uint32_t>((size >> (msb - kSubclassBits)) - kSubclasses);
  return (static_cast<std::uint32_t>(cls) << kSubclassBits) | sub;
}

void FreeBlockIndex::insert(Block* block) {
  const std::uint32_t bin = bin_of(block->size);
  block->free_bin = bin;
  block->free_prev = nullptr;
  block->free_next = bins_[bin];
  if (bins_[bin] != nullptr) bins_[bin]->free_prev = block;
  bins_[bin] = block;
  const int cls = class_of(bin);
  subclass_bitmaps_[cls] |= 1u << (bin & (kSubclasses - 1));
  class_bitmap_ |= std::uint64_t{1} << cls;
  ++count_;
  ++changes_;
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
  if (bins_[bin] == nullptr) {
    const int cls = class_of(bin);
    subclass_bitmaps_[cls] &= ~(1u << (bin & (kSubclasses - 1)));
    if (subclass_bitmaps_[cls] == 0) class_bitmap_ &= ~(std::uint64_t{1} << cls);
  }
  --count_;
  ++changes_;
}

Block* FreeBlockIndex::find(std::size_t size) const {
  const std::uint32_t own_bin = bin_of(size);
  // Blocks in the request's own bin may be smaller than the request: pick the smallest that fits
  // among the first few.
  Block* best = nullptr;
  int inspected = 0;
  for (Block* b = bins_[own_bin]; b != nullptr && inspected < kOwnClassScanLimit;
       b = b->free_next, ++inspected) {
    if (b->size >= size && (best == nullptr || b->size < best->size)) {
      best = b;
      if (b->size == size) break;
    }
  }
  if (best != nullptr) return best;

  // Every block in a later bin is larger than the request.
  const std::uint32_t next_bin = own_bin + 1;
  int cls = class_of(next_bin);
  if (cls >= kClasses) return nullptr;
  const int sub = static_cast<int>(next_bin & (kSubclasses - 1));
  std::uint32_t subs = subclass_bitmaps_[cls] & (~0u << sub);
  if (subs == 0) {
    const std::uint64_t higher =
        cls + 1 < 64 ? class_bitmap_ & (~std::uint64_t{0} << (cls + 1)) : 0;
    if (higher == 0) return nullptr;
    cls = std::countr_zero(higher);
    subs = subclass_bitmaps_[cls];
  }
  const auto bin = (static_cast<std::uint32_t>(cls) << kSubclassBits) |
                   static_cast<std::uint32_t>(std::countr_zero(subs));
  return bins_[bin];
}

}  // namespace vramledger
