// Free blocks of one stream and pool, indexed for O(1) good-fit search.
//
// Two-level segregated fit: sizes are grouped by power of two and each power is cut into 32
// equal classes, so every block in a class is within ~3% of the class minimum. A search looks
// for a fitting block in the request's own class (bounded scan), then takes the first block of
// the next non-empty class, found with two bitmap scans.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "allocator/detail/block.hpp"

namespace vramledger {

class FreeBlockIndex {
 public:
  static constexpr int kSubclassBits = 5;
  static constexpr int kSubclasses = 1 << kSubclassBits;
  static constexpr int kClasses = 64 - kSubclassBits + 1;

  void insert(Block* block);
  void remove(Block* block);
  // A free block of at least `size` bytes, or nullptr. The block stays in the index.
  Block* find(std::size_t size) const;

  // Calls visit(block) for up to `limit` free blocks of at least `size` bytes, smallest classes
  // first (for choosing among good fits by another criterion than size).
  template <typename Visitor>
  void for_each_fit(std::size_t size, int limit, Visitor&& visit) const {
    // Only non-empty bins, found through the bitmaps, in ascending order (as find would).
    const std::uint32_t first = bin_of(size);
    for (int cls = class_of(first); cls < kClasses && limit > 0; ++cls) {
      if ((class_bitmap_ >> cls & 1) == 0) continue;
      std::uint32_t subs = subclass_bitmaps_[cls];
      if (cls == class_of(first)) subs &= ~0u << (first & (kSubclasses - 1));
      for (; subs != 0 && limit > 0; subs &= subs - 1) {
        const auto bin = (static_cast<std::uint32_t>(cls) << kSubclassBits) |
                         static_cast<std::uint32_t>(std::countr_zero(subs));
        for (Block* b = bins_[bin]; b != nullptr && limit > 0; b = b->free_next) {
          if (b->size < size) continue;
          visit(b);
          --limit;
        }
      }
    }
  }
  std::size_t count() const { return count_; }
  // Inserts and removes so far: while it stands still, the index holds the same blocks.
  std::uint64_t changes() const { return changes_; }
  // Visits every block (for census and reports); order unspecified.
  template <typename Visitor>
  void for_each(Visitor&& visit) const {
    for (Block* head : bins_) {
      for (Block* b = head; b != nullptr; b = b->free_next) visit(b);
    }
  }

 private:
  static std::uint32_t bin_of(std::size_t size);
  static int class_of(std::uint32_t bin) { return static_cast<int>(bin >> kSubclassBits); }

  std::uint64_t class_bitmap_ = 0;
  std::array<std::uint32_t, kClasses> subclass_bitmaps_{};
  std::array<Block*, kClasses * kSubclasses> bins_{};
  std::size_t count_ = 0;
  std::uint64_t changes_ = 0;
};

}  // namespace vramledger
