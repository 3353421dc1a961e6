// Free blocks of one stream and pool, indexed for O(1) good-fit search.
//
// Two-level segregated fit (detail/size_bins.hpp): every block in a bin is within ~3% of the bin's
// minimum. A search looks for a fitting block in the request's own bin (bounded scan), then takes
// the first block of the next non-empty bin, found with two bitmap scans. Within a bin the newest
// block comes first.
//
// On the paged heap the index also keeps its span blocks' runs of mapped pages by length
// (mapped_runs(), detail/mapped_run_index.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "allocator/detail/block.hpp"
#include "allocator/detail/mapped_run_index.hpp"
#include "allocator/detail/size_bins.hpp"

namespace vramledger {

class FreeBlockIndex {
 public:
  void insert(Block* block);
  void remove(Block* block);
  // A free block of at least `size` bytes, or nullptr. The block stays in the index.
  Block* find(std::size_t size) const;

  // Calls visit(block) for up to `limit` free blocks of at least `size` bytes, smallest bins
  // first, newest first within a bin (for choosing among good fits by another criterion than
  // size).
  template <typename Visitor>
  void for_each_fit(std::size_t size, int limit, Visitor&& visit) const {
    // Only non-empty bins, found through the bitmaps, in ascending order (as find would).
    const std::uint32_t first = size_bins::bin_of(size);
    for (int cls = size_bins::class_of(first); cls < size_bins::kClasses && limit > 0; ++cls) {
      if ((occupied_.classes() >> cls & 1) == 0) continue;
      std::uint32_t subs = occupied_.subclasses(cls);
      if (cls == size_bins::class_of(first)) subs &= ~0u << (first & (size_bins::kSubclasses - 1));
      for (; subs != 0 && limit > 0; subs &= subs - 1) {
        const auto bin = (static_cast<std::uint32_t>(cls) << size_bins::kSubclassBits) |
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

  // The runs of mapped pages of the span blocks inserted from now on (the paged heap).
  void track_mapped_runs(std::size_t page_bytes) { mapped_runs_.enable(page_bytes); }
  MappedRunIndex& mapped_runs() { return mapped_runs_; }

 private:
  size_bins::BinBitmap occupied_;
  std::array<Block*, size_bins::kBins> bins_{};
  std::size_t count_ = 0;
  std::uint64_t changes_ = 0;
  MappedRunIndex mapped_runs_;
};

}  // namespace vramledger
