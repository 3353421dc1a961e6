// The runs of mapped pages inside one free-block index's free span blocks, binned by length, so
// that the tightest run holding an allocation is found by looking at one or two bins instead of
// at every free block large enough (the paged heap's placement when idle mapped memory is
// plentiful, detail/page_placement.cpp: that walk was ~40% of the paged heap's CPU on the GPT-2
// and T5 training traces).
//
// A run is a maximal stretch of mapped pages of a span, clipped to the free block it lies in.
// The choice must stay the one a walk over FreeBlockIndex::for_each_fit makes, since the corpus
// figures depend on it: the first run of the tightest length in that walk's order, which is
// blocks by bin ascending, newest-inserted first within a bin, runs in address order within a
// block (MappedRunIndex::before).
//
// Upkeep happens when asked, not on the hot path: a block entering the index is only queued
// (most leave again before the next query: a ring's free and reallocation); a change of a span's
// mapped pages is only noted. The next query scans the queued blocks, and rescans the scanned
// blocks a noted change overlaps. Runs come from an object pool: no heap allocation once warm.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocator/detail/block.hpp"
#include "allocator/detail/object_pool.hpp"
#include "allocator/detail/size_bins.hpp"

namespace vramledger {

struct AddressRange;

struct MappedRun {
  Block* block = nullptr;
  DevicePtr from = 0;
  std::size_t bytes = 0;
  MappedRun* next_in_block = nullptr;  // the block's next run, in address order
  MappedRun* bin_prev = nullptr;
  MappedRun* bin_next = nullptr;
  std::uint32_t bin = 0;
};

class MappedRunIndex {
 public:
  MappedRunIndex() = default;
  MappedRunIndex(const MappedRunIndex&) = delete;
  MappedRunIndex& operator=(const MappedRunIndex&) = delete;

  // Span blocks are tracked once the page size is known (the paged heap's first span).
  void enable(std::size_t page_bytes) {
    if (enabled()) return;
    page_bytes_ = page_bytes;
    page_shift_ = std::has_single_bit(page_bytes) ? std::countr_zero(page_bytes) : 0;
    bins_ = std::make_unique<Bins>();
  }
  bool enabled() const { return page_bytes_ != 0; }

  // `block` (of a span) entered or left the free-block index.
  void on_insert(Block* block);
  void on_remove(Block* block);
  // Whether `block` is in this index's queue or list (on_remove has something to undo).
  static bool tracks(const Block& block) { return block.run_list != kUntracked; }
  // Pages [first, end) of `span` were mapped or unmapped.
  void note_mapping_change(const AddressRange* span, std::size_t first, std::size_t end);

  // The tightest run of at least `size` bytes, first in the walk's order among equals; null if
  // none. Brings the runs up to date first (hence not const; the index's blocks are unchanged).
  const MappedRun* tightest(std::size_t size);

  // Whether `a` comes before `b` in the choice's order (see the header comment).
  static bool before(const MappedRun& a, const MappedRun& b) {
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    if (a.block != b.block) {
      if (a.block->free_bin != b.block->free_bin) return a.block->free_bin < b.block->free_bin;
      return a.block->free_seq > b.block->free_seq;
    }
    return a.from < b.from;
  }

 private:
  enum : std::uint8_t { kUntracked = 0, kQueued = 1, kScanned = 2 };
  struct BlockList {
    Block* head = nullptr;
    void push(Block* block);
    void unlink(Block* block);
  };

  void sync();
  void scan(Block* block);
  void drop_runs(Block* block);
  bool overlaps_a_change(const Block& block) const;
  // The page that `offset` bytes into a span lie in: a shift where the page size is a power of
  // two (the division was ~5% of a scan's samples; ~1% of BM_Trace's time on GPT-2's trace).
  std::size_t page_at(std::size_t offset) const {
    return page_shift_ != 0 ? offset >> page_shift_ : offset / page_bytes_;
  }

  std::size_t page_bytes_ = 0;
  int page_shift_ = 0;
  BlockList queued_;   // in the index, runs not yet found
  BlockList scanned_;  // in the index, runs in the bins
  struct Change {
    const AddressRange* span;
    std::size_t first;
    std::size_t end;
  };
  // Noted since the last query; past kMaxChanges every scanned block is rescanned instead.
  static constexpr std::size_t kMaxChanges = 16;
  std::vector<Change> changes_;
  bool everything_changed_ = false;
  // Allocated when enabled: the segment heap's indexes (and each stream's before its first
  // span) do without the 15 KiB.
  using Bins = std::array<MappedRun*, size_bins::kBins>;
  std::unique_ptr<Bins> bins_;
  size_bins::BinBitmap occupied_;
  ObjectPool<MappedRun> runs_;
};

}  // namespace vramledger
